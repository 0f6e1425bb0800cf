"""vLLM's OpenAI-compatible JSON shapes: stream chunks, whole responses, errors.

Streamed chunks are what vLLM's pydantic models give with `exclude_unset=True`; the final usage
chunk also drops None values (`exclude_none=True`), so it has no `metrics` key when there is no
per-request object. Whole responses carry every field, `metrics` null when there is none.
"""

from __future__ import annotations

import json
from typing import Any

Json = dict[str, Any]


def sse(data: Json | str) -> bytes:
    body = (
        data
        if isinstance(data, str)
        else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    )
    return f"data: {body}\n\n".encode()


def usage(prompt: int, completion: int) -> Json:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }


class Shapes:
    """Builds the JSON of one request, chat or text completion."""

    def __init__(self, chat: bool, request_id: str, created: int, model: str) -> None:
        self.chat = chat
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
        return {**self.head, "choices": [choice], "prompt_token_ids": None}

    def content_chunk(self, index: int, text: str, finish: str | None) -> Json:
        if self.chat:
            choice: Json = {
                "index": index,
                "delta": {"content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
        else:
            choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish}
        if finish is not None or not self.chat:
            choice["stop_reason"] = None
        return {**self.head, "choices": [choice]}

    def usage_chunk(self, prompt: int, completion: int, metrics: Json | None) -> Json:
        chunk: Json = {**self.head, "choices": [], "usage": usage(prompt, completion)}
        if metrics is not None:
            chunk["metrics"] = metrics
        return chunk

    def response(
        self,
        prompt: int,
        completion: int,
        texts: list[str],
        finishes: list[str],
        metrics: Json | None,
    ) -> Json:
        choices = []
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
                    }
                )
        head = {**self.head, "object": "chat.completion" if self.chat else "text_completion"}
        return {**head, "choices": choices, "usage": usage(prompt, completion), "metrics": metrics}


def error(status: int, message: str, kind: str, param: str | None = None) -> Json:
    """OpenAI-shaped error body, as vLLM sends it."""
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}
