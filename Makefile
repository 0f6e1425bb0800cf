# Humans' shortcuts; CI runs .ci/run, which ends in `make test`.
PY ?= python3

.PHONY: install test lint bench check
install:
	$(PY) -m pip install -e '.[test]'

test:
	$(PY) -m pytest -q -p no:cacheprovider

lint:
	ruff check . && ruff format --check . && mypy

bench:
	$(PY) bench/bench_parse.py
	$(PY) bench/bench_sidecar_cpu.py --seconds 60
	$(PY) bench/bench_relay.py
