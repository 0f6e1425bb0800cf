"""exporter/logs.py: where a line goes."""

from __future__ import annotations

import io
import sys

import pytest

from exporter import logs


def test_a_closed_stdout_from_setup_time_does_not_break_later_lines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An in-process `serve --check` sets logging up under a caller's stdout that is closed
    later (a test's capture): every line after it failed with "I/O operation on closed file"
    and took the proxy's connection handling with it."""
    early = io.StringIO()
    monkeypatch.setattr(sys, "stdout", early)
    logs.setup()
    early.close()
    monkeypatch.undo()
    logs.get("t").warning("still written", n=1)
    assert '"still written"' in capsys.readouterr().out
