"""llama-server for the GPU bench: llama.cpp as the llama-cpp-python sdist vendors it (the sdist
CI builds for the CPU), trimmed to what a server build reads, with the bench's patch
(`llamacpp-per-request.patch`: a request's own draft length and synthetic acceptance, so two
routes of different acceptance share one server), built with CUDA (or for the CPU, to try the
harness on a machine without a GPU).

    python -m bench.gpu.build --sdist llama_cpp_python-0.3.36.tar.gz --out build/  # or
    python -m bench.gpu.build --pack trimmed.tgz  # the trimmed, patched source (~7 MB) to carry

CUDA build: ~5 min on 16 cores (sm_90 only, f16 flash attention kernels only); CPU: ~20 min on
2 cores.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SDIST = "llama-cpp-python==0.3.36"
PATCH = Path(__file__).with_name("llamacpp-per-request.patch")
MARKER = ".specdec-bench-patched"
# what a server build does not read (GPU_FACTS: 176 MB unpacked -> 7 MB packed)
DROP = ("models", "docs", "media", "benches", "tests", "tools/ui/tests",
        "tools/ui/package-lock.json")  # fmt: skip
KEEP_BACKENDS = {"ggml-cpu", "ggml-cuda", "ggml-blas", "ggml-rpc"}
COMMON_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DBUILD_SHARED_LIBS=OFF",  # one binary to carry between machines
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
)
CUDA_FLAGS = (
    "-DGGML_CUDA=ON",
    "-DCMAKE_CUDA_ARCHITECTURES=90",  # Hopper (H100, H200); set --cuda-arch for another
    "-DGGML_CUDA_FA_QUANTS=f16-f16",
    "-DGGML_CUDA_NCCL=OFF",
)


class BuildError(Exception):
    """A step of the build failed; the message names it and the log."""


def unpack(archive: Path, into: Path) -> Path:
    """The llama.cpp source of an sdist (`vendor/llama.cpp`) or of a packed tree (`llama.cpp/`),
    extracted under `into`; the source directory."""
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        top = {n.split("/")[0] for n in names}
        root = next((f"{t}/vendor/llama.cpp" for t in sorted(top)
                     if f"{t}/vendor/llama.cpp/CMakeLists.txt" in names), None)  # fmt: skip
        if root is None and any(n == "llama.cpp" or n.startswith("llama.cpp/") for n in names):
            root = "llama.cpp"
        if root is None:
            raise BuildError(f"{archive}: neither an sdist with vendor/llama.cpp nor a packed tree")
        members = [m for m in tar.getmembers() if m.name == root or m.name.startswith(root + "/")]
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # 3.11.4+
        tar.extractall(into, members=members, **safe)  # type: ignore[arg-type]
    return into / root


def trim(src: Path) -> None:
    """Drop what a server build does not read: models, docs, tests, examples' contents, and
    every ggml backend but the CPU, CUDA, BLAS and RPC ones."""
    for rel in DROP:
        path = src / rel
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    examples = src / "examples"
    if examples.is_dir():
        for child in examples.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    for backend in (src / "ggml" / "src").glob("ggml-*"):
        if backend.is_dir() and backend.name not in KEEP_BACKENDS:
            shutil.rmtree(backend)


def apply_patch(src: Path, patch: Path = PATCH) -> None:
    """Apply a unified diff (ours: exact context, no fuzz) to `src`; a second call is a no-op
    (a marker file records it). BuildError naming the file and hunk that does not apply."""
    if (src / MARKER).is_file():
        return
    for target, hunks in parse_patch(patch.read_text(encoding="utf-8")):
        path = src / target
        text = path.read_text(encoding="utf-8")
        for number, (old, new) in enumerate(hunks, 1):
            if text.count(old) != 1:
                raise BuildError(f"{patch.name}: {target}, hunk {number} does not apply")
            text = text.replace(old, new)
        path.write_text(text, encoding="utf-8")
    (src / MARKER).write_text(patch.name + "\n")


def parse_patch(diff: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """[(file, [(old text, new text) per hunk])] of a unified diff."""
    files: list[tuple[str, list[tuple[str, str]]]] = []
    old: list[str] = []
    new: list[str] = []

    def close() -> None:
        if files and (old or new):
            files[-1][1].append(("".join(old), "".join(new)))
        old.clear()
        new.clear()

    for line in diff.splitlines(keepends=True):
        if line.startswith("+++ "):
            close()
            files.append((re.sub(r"^b/", "", line[4:].split("\t")[0].strip()), []))
        elif line.startswith(("--- ", "diff ")) or line.startswith("@@"):
            close()
        elif files and line.startswith(" "):
            old.append(line[1:])
            new.append(line[1:])
        elif files and line.startswith("-"):
            old.append(line[1:])
        elif files and line.startswith("+"):
            new.append(line[1:])
        elif files and line.startswith("\\"):
            continue  # "\ No newline at end of file"
    close()
    return files


def pack(src: Path, out: Path) -> None:
    """The trimmed, patched source as `llama.cpp/` in a .tgz (to carry to a GPU machine)."""
    with tarfile.open(out, "w:gz") as tar:
        tar.add(src, arcname="llama.cpp")


def build(src: Path, build_dir: Path, cuda: bool, jobs: int, log: Path,
          cuda_arch: str = "90") -> Path:  # fmt: skip
    """Configure and build `llama-server`; its path. BuildError with the log's tail."""
    flags = [*COMMON_FLAGS]
    if cuda:
        flags += [f if "ARCHITECTURES" not in f else f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch}"
                  for f in CUDA_FLAGS]  # fmt: skip
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    steps = (
        ["cmake", "-S", str(src), "-B", str(build_dir), *generator, *flags],
        ["cmake", "--build", str(build_dir), "--target", "llama-server", "-j", str(jobs)],
    )
    with log.open("ab") as out:
        for step in steps:
            if subprocess.run(step, stdout=out, stderr=subprocess.STDOUT).returncode:
                tail = log.read_text(errors="replace")[-3000:]
                raise BuildError(f"{' '.join(step[:3])} failed (log {log}):\n{tail}")
    binary = build_dir / "bin" / "llama-server"
    if not binary.is_file():
        raise BuildError(f"no {binary} after the build (log {log})")
    return binary


def fetch_sdist(into: Path) -> Path:
    """pip download the sdist (a machine with a package registry)."""
    into.mkdir(parents=True, exist_ok=True)
    found = sorted(into.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
               SDIST, "-d", str(into)]  # fmt: skip
        if subprocess.run(cmd).returncode:
            raise BuildError(f"pip download {SDIST} failed: pass --sdist or --source")
        found = sorted(into.glob("llama_cpp_python-*.tar.gz"))
    return found[-1]


def prepare(archive: Path | None, work: Path) -> Path:
    """The trimmed, patched source under `work` from an sdist or a packed tree (pip download
    when none is given)."""
    src_root = work / "src"
    existing = next(src_root.glob("**/llama.cpp"), None) if src_root.is_dir() else None
    if existing is not None and (existing / MARKER).is_file():
        return existing
    archive = archive or fetch_sdist(work / "sdist")
    src = unpack(archive, src_root)
    trim(src)
    apply_patch(src)
    return src


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdist", type=Path, help="the sdist or a packed tree (default: pip download)")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "specdec-gpu-build")
    ap.add_argument("--cpu", action="store_true", help="build for the CPU (no CUDA)")
    ap.add_argument("--cuda-arch", default="90")
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--pack", type=Path, help="only write the trimmed, patched source here")
    args = ap.parse_args()
    try:
        src = prepare(args.sdist, args.work)
        if args.pack:
            pack(src, args.pack)
            print(args.pack)
            return 0
        into = args.work / ("build-cpu" if args.cpu else "build-cuda")
        binary = build(src, into, not args.cpu, args.jobs, args.work / "build.log", args.cuda_arch)
    except BuildError as exc:
        print(f"build: {exc}", file=sys.stderr)
        return 1
    print(binary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
