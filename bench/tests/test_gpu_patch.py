"""bench/gpu's patch (a request's own synthetic acceptance and draft length) is written against
the llama.cpp the llama-cpp-python sdist vendors: it applies to CI's copy of the same sources
(unpacked by the real llama.cpp tests, tests/integration/test_real_llamacpp.py, which run
first in CI; skipped where that copy is not there)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.gpu import build as gpu_build
from harness.real_llamacpp.server import SDIST
from harness.real_llamacpp.server import cache_dir as llamacpp_cache


def test_the_gpu_benchs_patch_applies_to_cis_llamacpp(tmp_path: Path) -> None:
    version = SDIST.split("==")[1]
    source = llamacpp_cache() / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    if not source.is_dir():
        pytest.skip(f"no unpacked llama.cpp sources at {source} (the real llama.cpp tests')")
    for rel, _ in gpu_build.parse_patch(gpu_build.PATCH.read_text()):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((source / rel).read_text())
    gpu_build.apply_patch(tmp_path)
    assert "specdec" in (tmp_path / "tools/server/server-context.cpp").read_text()
