"""The bench's llama-servers: a plain one and speculative ones of the same target (a draft model,
synthetic acceptance, no draft-probability cut-off so every step drafts k), all started at once
and stopped on the way out whatever happens."""

from __future__ import annotations

import argparse
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.gpu.traffic import MODEL
from harness.process import Listening, healthy, terminate


@dataclass(frozen=True)
class Models:
    target: Path
    draft: Path


@dataclass(frozen=True)
class Launch:
    """How the servers run: slots, context, whether layers go to the GPU, and which servers'
    slots share one KV buffer ("": none, llama-server's default with explicit slots is a stream
    per slot; "plain": the plain server's only; "all")."""

    parallel: int = 32
    ctx: int = 65536  # 2048 a slot: the longest request and measure's lengthened ones
    gpu: bool = True
    kv_unified: str = ""
    flash_attn: str = "on"

    @staticmethod
    def add_flags(ap: argparse.ArgumentParser) -> None:
        """The launch's flags, one set for every script that starts the bench's servers."""
        ap.add_argument("--parallel", type=int, default=32, help="server slots (>= the top level)")
        ap.add_argument("--ctx", type=int, default=Launch.ctx, help="server context, all slots")
        ap.add_argument("--kv-unified", nargs="?", const="all", default="",
                        choices=("plain", "all"), help="one KV buffer for all slots: every "
                        "server's (no value) or the plain one's (plain)")  # fmt: skip
        ap.add_argument("--flash-attn", choices=("on", "off", "auto"), default="on")

    @classmethod
    def from_flags(cls, args: argparse.Namespace, gpu: bool = True) -> Launch:
        return cls(args.parallel, args.ctx, gpu, args.kv_unified, args.flash_attn)


@dataclass
class Server(Listening):
    name: str
    port: int
    args: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def healthy(self) -> bool:
        return healthy(self.base_url)

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc)


def command(binary: Path, models: Models, port: int, launch: Launch, k: int | None,
            rates: Sequence[float] = ()) -> list[str]:  # fmt: skip
    """A llama-server command: plain when `k` is None, else drafting up to k tokens a step with
    `rates` as the server-wide synthetic acceptance (requests bring their own)."""
    args = [
        str(binary), "-m", str(models.target), "--alias", MODEL,
        "--host", "127.0.0.1", "--port", str(port), "--metrics", "--no-webui",
        "-np", str(launch.parallel), "-c", str(launch.ctx), "-fa", launch.flash_attn,
        "--chat-template", "chatml",
        # no host-RAM prompt cache: saving each finished request's KV (~55 MB) stalls the
        # server's loop for ~35 ms per request (seen: plain decode at c=4 a third of c=1's)
        "--cache-ram", "0",
    ]  # fmt: skip
    if launch.gpu:
        args += ["-ngl", "99"]
    if launch.kv_unified == "all" or (launch.kv_unified == "plain" and k is None):
        args += ["--kv-unified"]
    if k is not None:
        args += [
            "--spec-type", "draft-simple", "-md", str(models.draft),
            "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0",
            "--spec-synth-rates", ",".join(f"{r:g}" for r in rates[:k]),
        ]  # fmt: skip
        if launch.gpu:
            args += ["-ngld", "99"]
    return args


@contextmanager
def running(servers: Sequence[Server], timeout: float = 300.0) -> Iterator[None]:
    """Start every server at once, wait until all are healthy; stop them all on the way out."""
    try:
        for s in servers:
            s.log.parent.mkdir(parents=True, exist_ok=True)
            with s.log.open("ab") as log:
                s.proc = subprocess.Popen(s.args, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL)  # fmt: skip
        deadline = time.monotonic() + timeout
        waiting = list(servers)
        while waiting:
            for s in list(waiting):
                if s.proc is not None and s.proc.poll() is not None:
                    tail = s.log.read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{s.name} llama-server exited:\n{tail}")
                if s.healthy():
                    waiting.remove(s)
            if waiting and time.monotonic() > deadline:
                names = ", ".join(s.name for s in waiting)
                raise TimeoutError(f"not healthy after {timeout:.0f} s: {names}")
            time.sleep(0.2)
        yield
    finally:
        for s in servers:
            s.stop()
