"""The server-side timing report (`bench/gpu/server_timings.py`): llama-server's own
`print_timing` lines read into requests, phases and the decode a token by sixth sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.gpu import server_timings as st


def stamp(seconds: float) -> str:
    """llama.cpp's log stamp: minutes.seconds.milliseconds.microseconds."""
    us = round(seconds * 1e6)
    return f"{us // 60_000_000}.{us // 1_000_000 % 60:02d}.{us // 1000 % 1000:03d}.{us % 1000:03d}"


def request(task: int, end: float, prompt_ms: float, decode_ms: float, tokens: int) -> list[str]:
    head = f"{stamp(end)} I slot print_timing: id  3 | task {task} |"
    return [
        f"{head} prompt eval time =   {prompt_ms:8.2f} ms /   350 tokens (0.4 ms per token)",
        f"{head}        eval time =   {decode_ms:8.2f} ms /   {tokens:3d} tokens (x ms per token)",
        f"{stamp(end)} I slot      release: id  3 | task {task} | stop processing",
    ]


def log() -> list[str]:
    """Two phases 10 s apart: the first's late requests decode at twice the early ones' ms."""
    lines = ["0.00.018.184 I srv  llama_server: initializing ..."]
    for i in range(12):  # sent at 0.5 s steps from 60 s, 1 s of decode each
        slow = i >= 6
        lines += request(i, 61.1 + 0.5 * i, 100.0, 1000.0, 50 if slow else 100)
    lines += request(99, 90.0, 100.0, 500.0, 100)
    return lines


def test_requests_and_phases_are_read_from_the_timing_lines() -> None:
    found = st.served(log())
    assert len(found) == 13
    first = found[0]
    assert first.start == pytest.approx(60.0) and first.end == pytest.approx(61.1)
    assert (first.prompt_ms, first.prompt_tokens, first.decode_ms, first.decoded) == (
        100.0, 350, 1000.0, 100
    )  # fmt: skip
    split = st.phases(found)
    assert [len(p) for p in split] == [12, 1]
    assert st.ms_per_token(split[1]) == pytest.approx(5.0)


def test_the_sixths_show_where_in_a_phase_decode_slowed() -> None:
    phase = st.phases(st.served(log()))[0]
    parts = st.by_part(phase)
    assert len(parts) == 6 and sum(n for n, _ in parts) == 12
    early, late = parts[0][1], parts[-1][1]
    assert early == pytest.approx(10.0) and late == pytest.approx(20.0)
    assert st.ms_per_token(phase) == pytest.approx(12 * 1000.0 / (6 * 100 + 6 * 50))


def test_the_report_and_a_missing_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "plain.log"
    path.write_text("\n".join(log()) + "\n", encoding="utf-8")
    lines = st.report(path)
    assert lines[0].endswith("2 phase(s); decode ms a token, all, then by sixth sent")
    assert "12 req" in lines[1] and " 13.33 " in lines[1]
    assert st.main([str(tmp_path / "absent.log")]) == 2
    assert "absent.log" in capsys.readouterr().err


def test_the_slices_show_the_batch_and_the_step_over_time(tmp_path: Path) -> None:
    """Early requests decode a token each 10 ms and late ones each 20 ms, two running at a
    time: the first slices read a batch of about 2 at 10 ms a step, the last at 20."""
    phase = st.phases(st.served(log()))[0]
    found = st.slices(phase, 0.5)
    batch, first = found[2]  # 61.0-61.5 s: requests 0, 1 and 2 for 0.1, 0.5 and 0.4 s
    assert batch == pytest.approx(2.0) and first == pytest.approx(10.0)
    assert found[-3] == (pytest.approx(2.0), pytest.approx(20.0))
    path = tmp_path / "plain.log"
    path.write_text("\n".join(log()) + "\n", encoding="utf-8")
    lines = st.slice_report(path, 0.5, {1})
    assert lines[0].endswith("batch:step ms in each 0.5 s") and lines[1].startswith("  1 ")
    with pytest.raises(SystemExit) as usage:  # a usage error: argparse's exit 2
        st.main(["--slices", "0", str(path)])
    assert usage.value.code == 2
