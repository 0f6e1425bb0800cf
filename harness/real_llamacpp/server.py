"""Run a real llama.cpp `llama-server` here: built from the sources PyPI's llama-cpp-python sdist
vendors (the only llama.cpp a registry serves as source), a tiny GGUF written locally.

    binary, gguf_py = ensure_server(cache)     # pip download + cmake, once (~5 min on 2 cores)
    model = ensure_model(gguf_py, cache)       # tiny random-weight Llama GGUF (once, < 1 s)
    with LlamaServer(binary, model, port, ("--spec-type", "ngram-simple")) as srv:
        srv.base_url, srv.metrics_url
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from harness.process import building, healthy, terminate
from harness.real_vllm.server import LocalServer, _run_logged, _tail

SDIST = "llama-cpp-python==0.3.36"
HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build_gguf.py"
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_NATIVE=OFF",  # the cache may move to another CPU of the same kind
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)


def cache_dir() -> Path:
    """Where the build and the model are kept between runs ($SPECDEC_LLAMACPP_CACHE, else
    ~/.cache/specdec-llamacpp)."""
    return Path(
        os.environ.get("SPECDEC_LLAMACPP_CACHE") or Path.home() / ".cache" / "specdec-llamacpp"
    )


def ensure_server(cache_dir: Path) -> tuple[Path, Path]:
    """cache_dir/build/bin/llama-server, built once (marker file); and the vendored gguf-py."""
    with building(cache_dir):
        return _ensure_server(cache_dir)


def _ensure_server(cache_dir: Path) -> tuple[Path, Path]:
    source = cache_dir / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"
    binary = cache_dir / "build" / "bin" / "llama-server"
    marker = cache_dir / "build" / ".specdec-complete"
    if marker.is_file() and marker.read_text().strip() == SDIST and binary.is_file():
        return binary, source / "gguf-py"
    log = cache_dir / "build.log"
    if not source.is_dir():
        sdist = cache_dir / "sdist"
        _run_logged(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary",
                ":all:",
                SDIST,
                "-d",
                str(sdist),
            ],
            log,
        )
        with tarfile.open(next(sdist.glob("llama_cpp_python-*.tar.gz"))) as tar:
            tar.extractall(cache_dir, filter="data")
    generator = ["-G", "Ninja"] if _has("ninja") else []
    build = str(cache_dir / "build")
    _run_logged(["cmake", "-S", str(source), "-B", build, *generator, *CMAKE_FLAGS], log)
    _run_logged(["cmake", "--build", build, "--target", "llama-server", "-j2"], log)
    marker.write_text(SDIST + "\n")
    return binary, source / "gguf-py"


def _has(tool: str) -> bool:
    return subprocess.run(["which", tool], capture_output=True).returncode == 0


def ensure_model(gguf_py: Path, cache_dir: Path) -> Path:
    """The tiny GGUF, rebuilt when build_gguf.py changes."""
    digest = hashlib.sha256(BUILD_SCRIPT.read_bytes()).hexdigest()[:16]
    out = cache_dir / f"tiny-{digest}.gguf"
    with building(cache_dir):
        if out.is_file():
            return out
        tmp = out.with_suffix(".tmp")
        _run_logged([sys.executable, str(BUILD_SCRIPT), str(gguf_py), str(tmp)],
                    cache_dir / "model-build.log")  # fmt: skip
        tmp.rename(out)
    return out


class LlamaServer(LocalServer):
    """`llama-server --metrics` on 127.0.0.1 with speculation, one slot per parallel stream."""

    def __init__(
        self,
        binary: Path,
        model: Path,
        port: int,
        spec_args: tuple[str, ...],
        log_path: Path,
        alias: str = "tiny",
        parallel: int = 4,
        startup_timeout: float = 120.0,
    ) -> None:
        self.binary, self.model, self.port, self.spec_args = binary, model, port, spec_args
        self.log_path, self.alias, self.parallel = log_path, alias, parallel
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [
            str(self.binary),
            "-m", str(self.model), "--alias", self.alias,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--metrics", "--parallel", str(self.parallel), "--ctx-size", "4096",
            "--threads", "1", "--chat-template", "chatml", "--no-webui",
            *self.spec_args,
        ]  # fmt: skip

    def start(self) -> None:
        """Start and wait for GET /health == 200 (raise with the log tail)."""
        with self.log_path.open("ab") as log:
            log.write(f"\n===== {' '.join(self.command())}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self.proc.poll() is not None:
                rc = self.proc.returncode
                self.proc = None
                raise RuntimeError(f"llama-server exited with {rc}:\n{_tail(self.log_path)}")
            if healthy(self.base_url):
                return
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"llama-server not healthy:\n{_tail(self.log_path)}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is None:
            return
        terminate(self.proc)
        self.proc = None
