"""A vLLM simulator: OpenAI-compatible API, vLLM's /metrics, per-request spec-decode objects,
acceptance profiles per request and a timing model, for the demo and for tests."""
