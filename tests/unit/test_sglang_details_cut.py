"""SGLang's spec details: read under every release's key names, and cut out of SGLang's own
bytes (tests/fixtures/sglang-0.5.23-wire.json, serialized by SGLang 0.5.23's own classes) so the
result is what SGLang sends without `return_spec_tokens_details`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporter.core.counts import BadSpecObject, Counts
from exporter.engines import sglang

WIRE = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "sglang-0.5.23-wire.json").read_text("utf-8")
)
DETAILS = json.loads(WIRE["chat sglext chunk"].removeprefix("data: "))["sglext"][
    "spec_tokens_details"
]


def cut(name: str) -> bytes:
    return sglang.without_details(WIRE[name].encode())


def test_a_chunk_that_only_carried_the_details_goes_whole() -> None:
    assert cut("chat sglext chunk") == b""
    assert cut("chat sglext chunk n=2") == b""
    assert cut("completion sglext chunk") == b""


def test_another_member_the_client_asked_for_stays_byte_for_byte() -> None:
    want = WIRE["chat sglext chunk cached+spec"].split(',"spec_tokens_details"')[0] + "}}\n\n"
    assert cut("chat sglext chunk cached+spec") == want.encode()


def test_a_whole_response_is_what_sglang_sends_without_the_flag() -> None:
    with_flag = "chat non-stream with sglext (model_dump_json(by_alias=True))"
    assert cut(with_flag) == WIRE["chat non-stream without sglext"].encode()


@pytest.mark.parametrize(
    "name",
    ["chat content chunk", "chat finish chunk", "chat usage chunk", "completion content chunk"],
)
def test_what_carries_no_details_passes_unchanged(name: str) -> None:
    assert cut(name) == WIRE[name].encode()


def test_the_details_are_the_requests_exact_counts() -> None:
    assert sglang.counts(DETAILS) == Counts(7.0, 21.0, 13.0, (6.0, 4.0, 3.0))
    two = json.loads(WIRE["chat sglext chunk n=2"].removeprefix("data: "))["sglext"]
    assert sglang.counts(two["spec_tokens_details"]) == Counts(9.0, 27.0, 16.0, (8.0, 5.0, 3.0))


@pytest.mark.parametrize(
    "renames",
    [
        {},  # 0.5.12+
        {  # 0.5.11 (aliases until 0.5.20)
            "spec_num_correct_drafts": "spec_accepted_drafts",
            "spec_num_proposed_drafts": "spec_proposed_drafts",
            "spec_correct_drafts_histogram": "spec_accept_histogram",
        },
        {  # <= 0.5.10.post1
            "spec_num_correct_drafts": "spec_accept_token_num",
            "spec_num_proposed_drafts": "spec_draft_token_num",
            "spec_correct_drafts_histogram": "spec_accept_histogram",
        },
    ],
)
def test_every_releases_key_names_read_the_same(renames: dict[str, str]) -> None:
    old = {renames.get(k, k): v for k, v in DETAILS.items()}
    assert sglang.counts(old) == Counts(7.0, 21.0, 13.0, (6.0, 4.0, 3.0))


@pytest.mark.parametrize(
    "bad",
    [
        {**DETAILS, "spec_verify_ct": 8},  # the histogram's steps disagree
        {**DETAILS, "spec_num_correct_drafts": 99},  # more accepted than proposed
        {**DETAILS, "spec_verify_ct": "7"},
        {k: v for k, v in DETAILS.items() if k != "spec_num_proposed_drafts"},
        [],
        "x",
        [DETAILS, None],
    ],
)
def test_anything_else_is_refused(bad: object) -> None:
    with pytest.raises(BadSpecObject):
        sglang.counts(bad)
