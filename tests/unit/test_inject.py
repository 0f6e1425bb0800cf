"""The proxy's stream_options injection: the body vLLM gets is the client's object plus the key,
whatever the client's formatting (the key is spliced in, not re-encoded)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from exporter.proxy.ask import with_key

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)


@given(
    obj=st.dictionaries(st.text(), values, max_size=5),
    indent=st.sampled_from([None, 0, 2]),
    trailing=st.sampled_from(["", " ", "\n", "\r\n\t "]),
    ascii_only=st.booleans(),
)
def test_the_body_is_the_object_plus_the_key(
    obj: dict[str, Any], indent: int | None, trailing: str, ascii_only: bool
) -> None:
    body = (json.dumps(obj, indent=indent, ensure_ascii=ascii_only) + trailing).encode()
    value = {"include_usage": True, "continuous_usage_stats": False}
    got = json.loads(with_key(body, json.loads(body), "stream_options", value))
    assert got == {**obj, "stream_options": value}
    assert list(got)[-1] == "stream_options" or "stream_options" in obj
