"""Write a Llama-architecture GGUF (random weights, a SentencePiece-style vocabulary) with the
gguf-py that the llama.cpp sources vendor, so a real `llama-server` can load it offline: the
tiny one CI's tests serve, and (`write` with a shape) the GPU bench's 7-8B target and its draft
(f16, each distinct matrix shape drawn once and shared by every layer: the values do not
matter, only the bytes a step reads).

Why not convert_hf_to_gguf.py: it refuses the tiny HF model of harness/real_vllm ("BPE
pre-tokenizer was not recognized"); the output's text is meaningless anyway, only the server's
counters, per-request timings and step times matter here.

    python build_gguf.py GGUF_PY_DIR OUT.gguf
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

WORDS = (
    "the a of to and in is it you that he was for on are with as his they be at one have this "
    "from or had by hot word but what some we can out other were all there when up use your how "
    "said an each she which do their time if will way about many then them write would like so "
    "these her long make thing see him two has look more day could go come did number sound no "
    "def return if else for while print self import class int str list dict none true false"
).split()


@dataclass(frozen=True)
class Shape:
    """A Llama model's dimensions; `f16` stores the matrices in half precision."""

    name: str
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx: int = 2048
    f16: bool = False


TINY = Shape("specdec-tiny", 64, 2, 4, 4, 128)
# the GPU bench (docs/BENCHMARKS.md §11): a memory-bound 7-8B target (14.0 GB f16) and a small
# draft of the same vocabulary (llama.cpp checks it)
TARGET = Shape("specdec-bench-8b", 4096, 32, 32, 8, 14336, 32768, f16=True)
DRAFT = Shape("specdec-bench-draft", 1024, 4, 16, 4, 2816, 32768, f16=True)

Fill = Callable[[tuple[int, ...]], Any]  # a shape -> an array of it (np.ndarray)


def numpy_fill(seed: int = 0, scale: float = 0.5) -> Fill:
    rng = np.random.default_rng(seed)
    return lambda shape: (rng.standard_normal(shape) * scale).astype(np.float32)


def write(gguf_py: str, out: str, shape: Shape = TINY, fill: Fill | None = None) -> int:
    """Write the model to `out`; its size in bytes."""
    sys.path.insert(0, gguf_py)
    import gguf

    fill = fill or numpy_fill()
    tokens: list[str] = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]  # byte fallback: every text tokenizes
    types += [gguf.TokenType.BYTE] * 256
    pieces = ["\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces += ["\u2581" + w for w in dict.fromkeys(WORDS)]  # each piece once
    tokens += pieces
    types += [gguf.TokenType.NORMAL] * len(pieces)
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    n_vocab = len(tokens)
    head_dim = shape.n_embd // shape.n_head
    kv = head_dim * shape.n_head_kv

    writer = gguf.GGUFWriter(out, "llama")
    writer.add_name(shape.name)
    writer.add_context_length(shape.n_ctx)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if shape.f16 else gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)

    made: dict[tuple[int, ...], Any] = {}

    def weight(*dims: int) -> Any:
        if not shape.f16:  # the tiny model: a draw per tensor, as CI's model always had
            return fill(dims)
        if dims not in made:
            made[dims] = fill(dims).astype(np.float16)
        return made[dims]

    ones = np.ones(shape.n_embd, dtype=np.float32)
    writer.add_tensor("token_embd.weight", weight(n_vocab, shape.n_embd))
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", weight(n_vocab, shape.n_embd))
    for i in range(shape.n_layer):
        block = f"blk.{i}."
        writer.add_tensor(block + "attn_norm.weight", ones)
        writer.add_tensor(block + "attn_q.weight", weight(shape.n_embd, shape.n_embd))
        writer.add_tensor(block + "attn_k.weight", weight(kv, shape.n_embd))
        writer.add_tensor(block + "attn_v.weight", weight(kv, shape.n_embd))
        writer.add_tensor(block + "attn_output.weight", weight(shape.n_embd, shape.n_embd))
        writer.add_tensor(block + "ffn_norm.weight", ones)
        writer.add_tensor(block + "ffn_gate.weight", weight(shape.n_ff, shape.n_embd))
        writer.add_tensor(block + "ffn_up.weight", weight(shape.n_ff, shape.n_embd))
        writer.add_tensor(block + "ffn_down.weight", weight(shape.n_embd, shape.n_ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(out).stat().st_size


def main(gguf_py: str, out: str) -> None:
    print(f"{out}: {write(gguf_py, out)} bytes")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
