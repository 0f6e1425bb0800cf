"""Build a tiny, deterministic Llama + byte-level BPE tokenizer for real-vLLM tests.

Usage: python build_model.py OUTDIR   (about 1.3 M params, 4096 tokens, float32)

Random weights never repeat themselves, so n-gram drafts would never be accepted.
The weights are hand-set instead (plus 1e-3 noise), with a residual stream of named
dims, so that greedy decoding is a token successor map perturbed by feedback:

* Layer 0 attention has q = k = 0: it averages over the whole prefix, writing
  the prefix means of a few embedding dims next to them. All else is ~0.
* CODE region (most ASCII tokens, split in halves +/-): succ(t) runs 3..8-token
  cycles inside a half, cross(t) jumps to the other half (logit 0.8 vs 1.0).
  lm_head adds -RHO * sign_j * mean(sign) over the prefix, so the output sticks
  to one cycle and switches half rarely: n-gram acceptance ~0.85-0.95.
* CHAT region (12 ASCII tokens, one-hot dims): random pairwise preferences minus
  PENALTY * (token frequency in the prefix). The output wanders among these 12
  tokens, so n-grams recur all the time but continue differently: acceptance ~0.4.
* The prompt ends with "\n" (chat template). Its successor is in CODE unless more
  than half of the prompt tokens hold non-ASCII bytes (e.g. Japanese), which
  tips it into CHAT. So: Japanese prompt -> low acceptance; code/English -> high.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SEED = 1234
VOCAB = 4096
HIDDEN, LAYERS, HEADS, FFN = 128, 2, 2, 256
ID = 108  # dims 0..107: token identity
CHAT0 = 108  # dims 108..: one-hot of CHAT tokens (prefix mean added by layer-0 attention)
STYLE, OSC, STYLE_MEAN, OSC_MEAN, NL = range(120, 125)  # named scalar dims
CHAT_SIZE = 12  # tokens in the CHAT region (<= 12); the other ASCII tokens are CODE
PENALTY = 10.0  # CHAT: logit -= PENALTY * (frequency of the token in the prefix)
CROSS = 0.8  # CODE: logit of cross(t) relative to succ(t) (= 1.0)
RHO = 0.2  # CODE: feedback strength of the +/- oscillator
ENTRY_CODE, ENTRY_CHAT, ENTRY_GAIN = 2.0, 1.6, 0.8  # "\n" -> CHAT if mean style > 0.5
NOISE = 1e-3  # small random perturbation on every weight
SPECIALS = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus_files() -> list[Path]:
    """Top-level stdlib modules, sorted, so the corpus is fixed for a Python version."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Train a 4096-token byte-level BPE on the stdlib sources."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in corpus_files()]
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=1024,
    )


def byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode (the ByteLevel alphabet)."""
    bs = [*range(33, 127), *range(161, 173), *range(174, 256)]
    cs = bs[:]
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + len(cs) - 188)
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def token_style(tokenizer: PreTrainedTokenizerFast) -> torch.Tensor:
    """1.0 for tokens holding non-ASCII bytes (e.g. Japanese), else 0.0."""
    dec = byte_decoder()
    style = torch.zeros(len(tokenizer))
    for tok, idx in tokenizer.get_vocab().items():
        if tok not in SPECIALS and any(dec[ch] > 127 for ch in tok):
            style[idx] = 1.0
    return style


def cycles(
    ids: torch.Tensor, lo: int, hi: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split `ids` into cycles of lo..hi tokens; return (sources, successors)."""
    order = ids[torch.randperm(len(ids), generator=gen)]
    src, dst, i = [], [], 0
    while i < len(order):
        cyc = order[i : i + int(torch.randint(lo, hi + 1, (1,), generator=gen))]
        src.append(cyc)
        dst.append(torch.roll(cyc, -1))
        i += len(cyc)
    return torch.cat(src), torch.cat(dst)


def build_model(tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    """Tiny Llama whose greedy output follows short token cycles, perturbed by feedback."""
    gen = torch.Generator().manual_seed(SEED)
    vocab = len(tokenizer)
    newline = tokenizer.encode("\n", add_special_tokens=False)
    assert len(newline) == 1, newline
    style = token_style(tokenizer)
    skip = set(tokenizer.convert_tokens_to_ids(SPECIALS)) | set(newline)
    ascii_ids = [i for i in range(vocab) if i not in skip and style[i] == 0]
    normal = torch.tensor(ascii_ids)[torch.randperm(len(ascii_ids), generator=gen)]
    chat, code = normal[:CHAT_SIZE], normal[CHAT_SIZE:]
    halves = {1: code[: len(code) // 2], -1: code[len(code) // 2 :]}
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(cfg).float()
    with torch.no_grad():
        for p in model.parameters():  # norms 1, every matrix ~N(0, NOISE)
            p.copy_(
                torch.ones_like(p) if p.dim() == 1 else torch.randn(p.shape, generator=gen) * NOISE
            )
        ident = torch.randn(vocab, ID, generator=gen)
        ident /= ident.norm(dim=1, keepdim=True)
        emb, head = model.model.embed_tokens.weight, model.lm_head.weight
        emb[:, :ID] += ident * (HIDDEN**0.5)  # RMS-normalises to ~ident * sqrt(HIDDEN)
        emb[:, STYLE] += style
        emb[newline, NL] += 1.0
        emb[chat, CHAT0 + torch.arange(CHAT_SIZE)] += 1.0
        # layer 0 attention: q = k ~ 0, i.e. a uniform average over the prefix
        attn = model.model.layers[0].self_attn
        pairs = [(STYLE, STYLE_MEAN), (OSC, OSC_MEAN)] + [
            (CHAT0 + k, CHAT0 + k) for k in range(CHAT_SIZE)
        ]
        for k, (src, dst) in enumerate(pairs):
            attn.v_proj.weight[k, src] = 1.0
            attn.o_proj.weight[dst, k] = 1.0
        unit = HIDDEN**-0.5  # so a matching identity gives logit ~1
        for sign, ids in halves.items():  # CODE: short cycles + weak +/- oscillator
            emb[ids, OSC] += sign
            src, dst = cycles(ids, 3, 8, gen)
            head[:, :ID].index_add_(0, dst, ident[src] * unit)  # index_add_: duplicates add up
            other = halves[-sign]
            cross = other[torch.randint(len(other), (len(ids),), generator=gen)]
            head[:, :ID].index_add_(0, cross, ident[ids] * unit * CROSS)
            head[ids, OSC_MEAN] -= RHO * sign
        # CHAT: random preferences between its tokens, minus a frequency penalty
        pref = torch.rand(CHAT_SIZE, CHAT_SIZE, generator=gen)
        head[:, :ID].index_add_(0, chat, pref.T @ ident[chat] * unit)
        head[chat, CHAT0 + torch.arange(CHAT_SIZE)] -= PENALTY
        head[chat, STYLE_MEAN] += ENTRY_GAIN
        head[halves[1][0], NL] += ENTRY_CODE
        head[chat[0], NL] += ENTRY_CHAT
    return model


def main(outdir: Path) -> None:
    """Build tokenizer + model and save both to `outdir`."""
    outdir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    tokenizer.save_pretrained(outdir)
    model.save_pretrained(outdir, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    print(f"saved {n} params, vocab {len(tokenizer)} to {outdir}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: build_model.py OUTDIR")
    main(Path(sys.argv[1]))
