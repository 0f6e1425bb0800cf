"""How each engine writes a completion on the wire, for the one simulated decoder.

vLLM's shapes are wire.Shapes (recorded: tests/fixtures/real-vllm-*). The others, each from a
recorded sample named in its class:

- SGLang 0.5.23 (its protocol.py / sse_utils.py serializers; samples in
  tests/fixtures/sglang-0.5.23-*): msgspec content chunks with `reasoning_content: null`, a
  separate finish chunk per choice (chat), `sglext.spec_tokens_details` when the request sets
  `return_spec_tokens_details` (its own `"choices":[]` chunk after the finish chunks; the last
  key of a whole response; a list when n > 1), the usage chunk only with include_usage.
- llama.cpp (a real llama-server, tests/fixtures/real-llamacpp-*): its key order, a finish
  chunk of its own with `timings` (draft_n, draft_n_accepted), which move to a usage chunk when
  the stream asks for usage; n must be 1.
- TensorRT-LLM: vLLM's OpenAI shapes without a per-request object (it sends none, #19311).
"""

from __future__ import annotations

import json

from exporter.sim.decoder import RequestStats
from exporter.sim.wire import Json


def dumps(data: Json) -> bytes:
    """Compact JSON in insertion order, UTF-8 as is: how all three write their bodies."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()


def event(data: Json) -> bytes:
    return b"data: " + dumps(data) + b"\n\n"


# ---------------------------------------------------------------- SGLang


def sglang_details(stats: RequestStats) -> Json | None:
    """SGLang's SpecTokensDetails of one choice; None when it made no verify step (then SGLang
    writes no details). The histogram grows to the largest count seen, as SGLang's does."""
    steps = sum(stats.histogram)
    if steps == 0:
        return None
    accepted = sum(j * n for j, n in enumerate(stats.histogram))
    top = max(j for j, n in enumerate(stats.histogram) if n)
    return {
        "spec_accept_rate": accepted / stats.draft_tokens if stats.draft_tokens else 0.0,
        "spec_accept_length": stats.completion_tokens / steps,
        "spec_cap_length": 0.0,
        "spec_block_accept_length": 0.0,
        "spec_num_correct_drafts": accepted,
        "spec_num_proposed_drafts": stats.draft_tokens,
        "spec_verify_ct": steps,
        "spec_correct_drafts_histogram": stats.histogram[: top + 1],
        "spec_cap_lens_histogram": [],
    }


class SglangShapes:
    """SGLang 0.5.23's chunks and responses."""

    def __init__(self, chat: bool, request_id: str, created: int, model: str) -> None:
        self.chat = chat
        self.head: Json = {
            "id": request_id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created,
            "model": model,
        }

    def opening(self, n: int) -> list[bytes]:
        if not self.chat:
            return []
        delta = {"reasoning_content": None, "role": "assistant", "content": ""}
        return [event(self._chunk(i, delta, None)) for i in range(n)]

    def content(self, index: int, text: str, finish: str | None) -> list[bytes]:
        if not self.chat:
            choice = {
                "index": index,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "matched_stop": _matched(finish),
            }
            return [event({**self.head, "choices": [choice], "usage": None})]
        out = [event(self._chunk(index, {"reasoning_content": None, "content": text}, None))]
        if finish is not None:  # chat: a chunk of its own carries the finish
            out.append(event(self._chunk(index, {"reasoning_content": None}, finish)))
        return out

    def closing(
        self, prompt: int, completion: int, stats: list[RequestStats], flag: bool, usage_: bool
    ) -> list[bytes]:
        out = []
        details = _details(stats) if flag else None
        if details is not None:
            sglext = {"spec_tokens_details": details}
            out.append(event({**self.head, "choices": [], "usage": None, "sglext": sglext}))
        if usage_:
            out.append(
                event({**self.head, "choices": [], "usage": self._usage(prompt, completion)})
            )
        return out

    def response(
        self,
        prompt: int,
        completion: int,
        texts: list[str],
        finishes: list[str],
        stats: list[RequestStats],
        flag: bool,
    ) -> Json:
        choices: list[Json] = []
        for i, (text, finish) in enumerate(zip(texts, finishes, strict=True)):
            if self.chat:
                message = {"role": "assistant", "content": text, "reasoning_content": None}
                body: Json = {"index": i, "message": message}
            else:
                body = {"index": i, "text": text}
            choices.append(
                body | {"logprobs": None, "finish_reason": finish, "matched_stop": _matched(finish)}
            )
        out: Json = {
            **self.head,
            "object": "chat.completion" if self.chat else "text_completion",
            "choices": choices,
            "usage": self._usage(prompt, completion, whole=True),
            "metadata": {"weight_version": "default"},
        }
        details = _details(stats) if flag else None
        if details is not None:
            out["sglext"] = {"spec_tokens_details": details}
        return out

    def _chunk(self, index: int, delta: Json, finish: str | None) -> Json:
        choice = {
            "index": index,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish,
            "matched_stop": _matched(finish),
        }
        return {**self.head, "choices": [choice]}

    def _usage(self, prompt: int, completion: int, whole: bool = False) -> Json:
        base = {"prompt_tokens": prompt, "total_tokens": prompt + completion}
        base["completion_tokens"] = completion
        if not (self.chat or whole):  # the completions usage chunk drops its None fields
            return base | {"reasoning_tokens": 0}
        return base | {
            "prompt_tokens_details": None,
            "reasoning_tokens": 0,
            "completion_tokens_details": None,
        }


def _details(stats: list[RequestStats]) -> Json | list[Json] | None:
    found = [d for d in map(sglang_details, stats) if d is not None]
    if not found:
        return None
    return found if len(stats) > 1 else found[0]


def _matched(finish: str | None) -> int | None:
    return 2 if finish == "stop" else None  # the id of the end-of-sequence token SGLang matched


# ---------------------------------------------------------------- llama.cpp


def llamacpp_timings(prompt: int, stats: RequestStats, prompt_s: float, predicted_s: float) -> Json:
    """llama-server's `timings`: the prompt's time to the first token and the decode's time
    after it, as this request spent them; `draft_n` only once it drafted (as server-common.cpp)."""
    prompt_ms, predicted_ms = 1000.0 * prompt_s, 1000.0 * predicted_s
    tokens = stats.completion_tokens
    out: Json = {
        "cache_n": 0,
        "prompt_n": prompt,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / max(1, prompt),
        "prompt_per_second": 1000.0 * prompt / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / max(1, tokens),
        "predicted_per_second": 1000.0 * tokens / predicted_ms if predicted_ms > 0 else 0.0,
    }
    if stats.draft_tokens:
        accepted = sum(j * n for j, n in enumerate(stats.histogram))
        out |= {"draft_n": stats.draft_tokens, "draft_n_accepted": accepted}
    return out


class LlamacppShapes:
    """llama-server's chunks and responses (b1-0c1e570, from llama-cpp-python 0.3.36)."""

    def __init__(self, chat: bool, request_id: str, created: int, model: str, build: str) -> None:
        self.chat, self.id, self.created, self.model, self.build = (
            chat,
            request_id,
            created,
            model,
            build,
        )

    def content(self, text: str) -> bytes:
        if self.chat:
            choice: Json = {"finish_reason": None, "index": 0, "delta": {"content": text}}
            return event({"choices": [choice], **self._chunk_tail()})
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": None}
        return event({"choices": [choice], **self._text_tail()})

    def closing(
        self,
        prompt: int,
        stats: RequestStats,
        finish: str,
        usage_: bool,
        spent: tuple[float, float],
    ) -> list[bytes]:
        timings = llamacpp_timings(prompt, stats, *spent)
        used = _llama_usage(prompt, stats.completion_tokens)
        if not self.chat:  # the finish chunk of /v1/completions carries usage and timings
            choice: Json = {"text": "", "index": 0, "logprobs": None, "finish_reason": finish}
            head = {"choices": [choice], **self._text_tail()}
            rest = {"usage": used, "id": head.pop("id"), "timings": timings}
            return [event(head | rest)]
        choice = {"finish_reason": finish, "index": 0, "delta": {}}
        last = {"choices": [choice], **self._chunk_tail()}
        if not usage_:
            return [event(last | {"timings": timings})]
        final = {"choices": [], **self._chunk_tail(), "usage": used, "timings": timings}
        return [event(last), event(final)]

    def response(
        self, prompt: int, text: str, finish: str, stats: RequestStats, spent: tuple[float, float]
    ) -> Json:
        if self.chat:
            message = {"role": "assistant", "content": text}
            choice: Json = {"finish_reason": finish, "index": 0, "message": message}
            head: Json = {"choices": [choice], "created": self.created, "model": self.model}
            head |= {"system_fingerprint": self.build, "object": "chat.completion"}
        else:
            choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}
            head = {"choices": [choice], "created": self.created, "model": self.model}
            head |= {"system_fingerprint": self.build, "object": "text_completion"}
        return head | {
            "usage": _llama_usage(prompt, stats.completion_tokens),
            "id": self.id,
            "timings": llamacpp_timings(prompt, stats, *spent),
        }

    def _chunk_tail(self) -> Json:
        return {
            "created": self.created,
            "id": self.id,
            "model": self.model,
            "system_fingerprint": self.build,
            "object": "chat.completion.chunk",
        }

    def _text_tail(self) -> Json:
        return {
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.build,
            "object": "text_completion",
            "id": self.id,
        }


def _llama_usage(prompt: int, completion: int) -> Json:
    return {
        "completion_tokens": completion,
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
