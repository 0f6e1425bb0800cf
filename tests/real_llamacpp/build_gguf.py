"""Write a tiny Llama-architecture GGUF (random weights, a SentencePiece-style vocabulary) with
the gguf-py that the llama.cpp sources vendor, so a real `llama-server` can load it offline.

Why not convert_hf_to_gguf.py: it refuses the tiny HF model of tests/real_vllm ("BPE
pre-tokenizer was not recognized"); the output's text is meaningless anyway, only the server's
counters and per-request timings matter here.

    python build_gguf.py GGUF_PY_DIR OUT.gguf
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

N_EMBD, N_LAYER, N_HEAD, N_FF, N_CTX = 64, 2, 4, 128, 2048
WORDS = (
    "the a of to and in is it you that he was for on are with as his they be at one have this "
    "from or had by hot word but what some we can out other were all there when up use your how "
    "said an each she which do their time if will way about many then them write would like so "
    "these her long make thing see him two has look more day could go come did number sound no "
    "def return if else for while print self import class int str list dict none true false"
).split()


def main(gguf_py: str, out: str) -> None:
    sys.path.insert(0, gguf_py)
    import gguf

    rng = np.random.default_rng(0)
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

    writer = gguf.GGUFWriter(out, "llama")
    writer.add_name("specdec-tiny")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.5).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(n_vocab, N_EMBD))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.add_tensor("output.weight", weight(n_vocab, N_EMBD))
    for i in range(N_LAYER):
        block = f"blk.{i}."
        writer.add_tensor(block + "attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(block + name + ".weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(block + "ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(block + "ffn_gate.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(block + "ffn_up.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(block + "ffn_down.weight", weight(N_EMBD, N_FF))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{out}: {n_vocab} tokens, {Path(out).stat().st_size} bytes")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
