"""vLLM's OpenAI-compatible JSON shapes, as the real 0.32 server sends them.

Streamed chunks are vLLM's pydantic models dumped with `exclude_unset=True`, so a key is there
when vLLM set it, even to null; the final usage chunk also drops None values (`exclude_none`),
so it has no `metrics` key without a per-request object. The terminal chunk carries the
`system_fingerprint` only when no usage chunk follows. Whole responses carry every field.
Recorded real responses: tests/fixtures/real-vllm-*.
"""

from __future__ import annotations

import json
from typing import Any

Json = dict[str, Any]
TIMING_NULLS = (
    "time_to_first_token_ms",
    "generation_time_ms",
    "queue_time_ms",
    "mean_itl_ms",
    "tokens_per_second",
)


# vLLM's stream models dump their fields in declaration order, whatever order they were set in
CHUNK_ORDER = (
    "id",
    "object",
    "created",
    "model",
    "choices",
    "usage",
    "system_fingerprint",
    "prompt_token_ids",
    "prompt_text",
    "metrics",
)


def sse(data: Json | str) -> bytes:
    if isinstance(data, str):
        return f"data: {data}\n\n".encode()
    ordered = {key: data[key] for key in CHUNK_ORDER if key in data}
    return f"data: {json.dumps(ordered, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


def usage(prompt: int, completion: int, details: bool = False) -> Json:
    """`details`: the continuous per-chunk usage also has completion_tokens_details (null)."""
    out: Json = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }
    if details:
        out["completion_tokens_details"] = None
    return out


class Shapes:
    """Builds the JSON of one request, chat or text completion."""

    def __init__(
        self, chat: bool, request_id: str, created: int, model: str, fingerprint: str
    ) -> None:
        self.chat = chat
        self.fingerprint = fingerprint
        self.head: Json = {
            "id": request_id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created,
            "model": model,
        }

    def role_chunk(self, index: int) -> Json:
        choice = {
            "index": index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return {**self.head, "choices": [choice], "prompt_token_ids": None, "prompt_text": None}

    def content_chunk(self, index: int, text: str, finish: str | None) -> Json:
        if self.chat:
            choice: Json = {
                "index": index,
                "delta": {"content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
            if finish is not None:
                choice["stop_reason"] = None
            choice["token_ids"] = None
        else:
            choice = {
                "index": index,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
                "prompt_token_ids": None,
                "token_ids": None,
            }
        return {**self.head, "choices": [choice]}

    def usage_chunk(self, prompt: int, completion: int, metrics: Json | None) -> Json:
        chunk: Json = {
            **self.head,
            "choices": [],
            "usage": usage(prompt, completion),
            "system_fingerprint": self.fingerprint,
        }
        if metrics is not None:
            chunk["metrics"] = metrics
        return chunk

    def response(
        self, prompt: int, completion: int, texts: list[str], finishes: list[str], spec: Json | None
    ) -> Json:
        choices: list[Json] = []
        for i, (text, finish) in enumerate(zip(texts, finishes, strict=True)):
            if self.chat:
                message = {
                    "role": "assistant",
                    "content": text,
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "reasoning": None,
                }
                choices.append(
                    {
                        "index": i,
                        "message": message,
                        "logprobs": None,
                        "finish_reason": finish,
                        "stop_reason": None,
                        "token_ids": None,
                        "routed_experts": None,
                    }
                )
            else:
                choices.append(
                    {
                        "index": i,
                        "text": text,
                        "logprobs": None,
                        "finish_reason": finish,
                        "stop_reason": None,
                        "token_ids": None,
                        "prompt_logprobs": None,
                        "prompt_token_ids": None,
                        "routed_experts": None,
                    }
                )
        body: Json = {
            **self.head,
            "object": "chat.completion" if self.chat else "text_completion",
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": self.fingerprint,
            "usage": {
                **usage(prompt, completion),
                "prompt_tokens_details": None,
                "completion_tokens_details": None,
            },
        }
        if self.chat:
            body |= {"prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None}
        metrics = (
            None if spec is None else {**dict.fromkeys(TIMING_NULLS), "speculative_decoding": spec}
        )
        return body | {"kv_transfer_params": None, "ec_transfer_params": None, "metrics": metrics}


def error(status: int, message: str, kind: str, param: str | None = None) -> Json:
    """OpenAI-shaped error body, as vLLM sends it."""
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}
