#!/usr/bin/env python3
"""The path `config` takes from `specdec serve`: every call into our code that is handed a
piece of the configuration (the Config, or a target, route, model or proxy section of it),
recorded in order while `serve --config` starts, reloads once (SIGHUP) and stops (the
configuration's own methods left out). Printed:
the files in the order entered (consecutive calls in one file collapsed), the hops between
them, the distinct files, and the returns into a file already left (a back-and-forth that
a reader has to follow).

    python bench/config_path.py [--repo DIR] [--record]  # DIR: a checkout (default: this one)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from _run import add_outputs, keep

TRACER = textwrap.dedent(
    """
    import os, sys, threading, signal, time
    seq = []
    KINDS = {"Config", "ProxyConfig", "Target", "ModelConfig", "Route"}

    def profile(frame, event, arg):
        if event != "call":
            return
        name = frame.f_code.co_filename
        if "/exporter/" not in name:
            return
        for key, value in list(frame.f_locals.items()):
            kind = type(value)
            if key == "self":  # the configuration's own methods are not a hop
                continue
            if kind.__name__ in KINDS and kind.__module__.startswith("exporter.config"):
                seq.append(name.split("/exporter/", 1)[1])
                return

    def later():
        time.sleep(2.5)
        seq.append("SIGHUP")
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(2.5)
        os.kill(os.getpid(), signal.SIGTERM)

    sys.setprofile(profile)
    threading.setprofile(profile)
    threading.Thread(target=later, daemon=True).start()
    sys.argv = ["specdec", "serve", "--config", sys.argv[1], "--listen", sys.argv[2]]
    try:
        from exporter.cli import main
        main()
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
        with open(os.environ["PATH_OUT"], "w") as f:
            f.write("\\n".join(seq))
    """
)

CONFIG = """targets:
  - {name: vllm, url: "http://127.0.0.1:9/metrics", interval: 1s}
proxy:
  upstream: http://127.0.0.1:9
  listen: 127.0.0.1:%d
  routes:
    - {name: voice_chat, when: {header: {x-route: voice}}}
models:
  - {name: m, num_speculative_tokens: 3, step_cost_ratio: 1.78, plain_decode_tokens_per_second: 72}
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def trace(repo: Path) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        config, out = Path(tmp) / "specdec.yaml", Path(tmp) / "path.txt"
        config.write_text(CONFIG % free_port(), encoding="utf-8")
        env = {**os.environ, "PATH_OUT": str(out), "PYTHONPATH": str(repo)}
        subprocess.run(
            [sys.executable, "-c", TRACER, str(config), f"127.0.0.1:{free_port()}"],
            cwd=repo, env=env, capture_output=True, timeout=60, check=False,
        )  # fmt: skip
        return out.read_text(encoding="utf-8").split("\n") if out.exists() else []


def collapsed(files: list[str]) -> list[str]:
    return [f for i, f in enumerate(files) if f and (i == 0 or files[i - 1] != f)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    add_outputs(ap)
    args = ap.parse_args()
    files = trace(args.repo.resolve())
    if not files:
        print("no calls recorded (did serve start?)", file=sys.stderr)
        return 1
    cut = files.index("SIGHUP") if "SIGHUP" in files else len(files)
    figures = {}
    for part, calls in (("start", files[:cut]), ("reload", files[cut + 1 :])):
        path = collapsed(calls)
        seen: set[str] = set()
        returns = 0
        for f in path:
            returns += f in seen
            seen.add(f)
        print(f"{part}: " + " -> ".join(path))
        print(f"  hops {max(len(path) - 1, 0)}, files {len(seen)}, returns into a file already "
              f"left {returns}")  # fmt: skip
        figures[part] = {"hops": max(len(path) - 1, 0), "files": len(seen), "returns": returns}
    keep(args, "config_path", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
