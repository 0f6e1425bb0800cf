"""The bench's models, written locally (no downloads): a memory-bound 7-8B target and a small
draft of the same vocabulary, random f16 weights (harness/real_llamacpp/build_gguf.py), drawn on
the GPU with torch when it is there (~15 s for both), else with numpy. `tiny` writes CI's tiny
model twice instead: the harness's logic on a machine without a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.gpu.servers import Models
from harness.real_llamacpp.build_gguf import DRAFT, TARGET, TINY, Fill, numpy_fill, write


def gpu_fill(scale: float = 0.02) -> Fill | None:
    """Random f16 matrices drawn on the GPU (None without torch and CUDA)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None

    def fill(shape: tuple[int, ...]) -> Any:
        return (torch.randn(shape, device="cuda", dtype=torch.float16) * scale).cpu().numpy()

    return fill


def write_models(gguf_py: Path, into: Path, tiny: bool = False) -> Models:
    """Target and draft GGUFs under `into` (kept if already there)."""
    into.mkdir(parents=True, exist_ok=True)
    target, draft = into / "target.gguf", into / "draft.gguf"
    fill = numpy_fill(scale=0.5) if tiny else (gpu_fill() or numpy_fill(scale=0.02))
    for path, shape in ((target, TINY if tiny else TARGET), (draft, TINY if tiny else DRAFT)):
        if not path.is_file():
            tmp = path.with_suffix(".tmp")
            write(str(gguf_py), str(tmp), shape, fill)
            tmp.rename(path)
    return Models(target, draft)
