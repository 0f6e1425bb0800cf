"""Config: every bad file fails with file:line: key: message; a good one loads as dataclasses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from exporter.config import (
    DEFAULT_INTERVAL,
    DEFAULT_LISTEN,
    DEFAULT_TIMEOUT,
    Config,
    ConfigError,
    Target,
    default_name,
    from_flags,
    load,
    redact,
)
from exporter.core.windows import DEFAULT_WINDOWS, Window

from .pages import BAD_CONFIGS

BAD = sorted(BAD_CONFIGS.glob("*.yaml"))


def expected_message(config: Path) -> str:
    return config.with_suffix(".expected").read_text(encoding="utf-8").strip()


def test_the_bad_config_folder_is_complete():
    assert len(BAD) >= 15
    for config in BAD:
        assert config.with_suffix(".expected").is_file(), f"{config.name} has no .expected"
    expected = sorted(p.with_suffix(".yaml") for p in BAD_CONFIGS.glob("*.expected"))
    assert expected == BAD, "an .expected file without its .yaml"


@pytest.mark.parametrize("config", BAD, ids=[p.stem for p in BAD])
def test_bad_config(config: Path):
    """Each expected line names the file first; a file with several errors reports them all,
    one line each, in the file's order (docs/configuration.md promises it)."""
    expected = expected_message(config).splitlines()
    assert all(e.startswith(config.name + ":") for e in expected), "a line names the file first"
    lines_named = [int(e.split(":")[1]) for e in expected if e.split(":")[1].isdigit()]
    assert lines_named == sorted(lines_named), "the .expected lines go in the file's order"
    with pytest.raises(ConfigError) as info:
        load(config)
    lines = str(info.value).splitlines()
    assert info.value.messages == lines
    assert len(lines) == len(expected), lines
    for got, want in zip(lines, expected, strict=True):
        assert want in got
        assert got.startswith(str(config))


def test_an_interval_error_comes_in_the_same_run_as_the_others() -> None:
    """The interval is checked against the windows after the fields are read; it used to wait
    until every other error was fixed. Three errors in three places: one run, file order."""
    config = BAD_CONFIGS / "three_places_with_interval.yaml"
    with pytest.raises(ConfigError) as info:
        load(config)
    keys = [m.split(": ")[1] for m in info.value.messages]
    assert keys == ["proxy.max_in_flight", "targets[0].interval", "models[0].step_cost_ratio"]


@pytest.mark.parametrize(
    "name",
    ["unknown_key", "yaml_syntax", "bad_engine", "windows_duplicate", "listen_unicode_digit"],
)
def test_serve_with_a_bad_config_exits_2_with_the_message_on_stderr(name):
    config = BAD_CONFIGS / f"{name}.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert expected_message(config) in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_serve_with_a_missing_config_exits_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "serve", "--config", str(tmp_path / "nope.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "nope.yaml: cannot read" in proc.stderr


GOOD = """\
# a full config
listen: "127.0.0.1:9500"
windows: [30s, 5m, 1h]
targets:
  - name: gpu0
    url: http://10.0.0.1:8000/metrics
  - name: kserve-a
    url: https://user:secret@10.0.0.2:8443/metrics?token=abc
    engine: vllm
    prefix: "kserve_vllm:"
    interval: 500ms
    timeout: 1.5
  - url: http://10.0.0.3:8080/prometheus/metrics
    engine: trtllm
    interval: 10s
    timeout: 1m
"""


def test_good_config_loads_into_dataclasses(tmp_path):
    path = tmp_path / "specdec.yaml"
    path.write_text(GOOD, encoding="utf-8")
    assert load(path) == Config(
        listen=("127.0.0.1", 9500),
        targets=(
            Target("gpu0", "http://10.0.0.1:8000/metrics"),
            Target(
                "kserve-a",
                "https://user:secret@10.0.0.2:8443/metrics?token=abc",
                "vllm",
                "kserve_vllm:",
                0.5,
                1.5,
            ),
            Target(
                "10.0.0.3:8080",
                "http://10.0.0.3:8080/prometheus/metrics",
                "trtllm",
                None,
                10.0,
                60.0,
            ),
        ),
        windows=(Window("30s", 30.0), Window("5m", 300.0), Window("1h", 3600.0)),
    )


def test_minimal_config_takes_the_defaults(tmp_path):
    path = tmp_path / "min.yaml"
    path.write_text("targets:\n  - url: http://127.0.0.1:8000/metrics\n", encoding="utf-8")
    config = load(path)
    assert config.listen == DEFAULT_LISTEN
    assert config.windows == DEFAULT_WINDOWS
    assert config.targets == (
        Target(
            "127.0.0.1:8000",
            "http://127.0.0.1:8000/metrics",
            "vllm",
            None,
            DEFAULT_INTERVAL,
            DEFAULT_TIMEOUT,
        ),
    )


@pytest.mark.parametrize(
    ("listen", "expected"),
    [(":9500", ("0.0.0.0", 9500)), ("[::1]:9500", ("::1", 9500)), ("host:1", ("host", 1))],
)
def test_listen_forms(listen, expected):
    assert from_flags(["http://a:1/metrics"], listen, 1.0, None).listen == expected


def test_from_flags_builds_the_same_config():
    config = from_flags(
        ["http://10.0.0.1:8000/metrics", "http://10.0.0.2:8000/metrics"], ":9500", 2.0, ["2m"]
    )
    assert config == Config(
        listen=("0.0.0.0", 9500),
        targets=(
            Target("10.0.0.1:8000", "http://10.0.0.1:8000/metrics", interval=2.0),
            Target("10.0.0.2:8000", "http://10.0.0.2:8000/metrics", interval=2.0),
        ),
        windows=(Window("2m", 120.0),),
    )
    assert from_flags(["http://a:1/metrics"], None, 1.0, None).windows == DEFAULT_WINDOWS


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            (["ftp://a:1/metrics"], None, 1.0, None),
            "command line: --target[0]: expected an http(s)://HOST:PORT/metrics URL",
        ),
        (
            (["http://a:1/metrics", "localhost:8000/metrics"], None, 1.0, None),
            "command line: --target[1]: expected an http(s)://HOST:PORT/metrics URL",
        ),
        (
            (["http://a:99999/metrics"], None, 1.0, None),
            "command line: --target[0]: bad port in URL",
        ),
        (
            (["http://a:1/metrics"], "9500", 1.0, None),
            "command line: --listen: expected HOST:PORT (or :PORT), got '9500'",
        ),
        (
            (["http://a:1/metrics"], ":0", 1.0, None),
            "command line: --listen: expected HOST:PORT",
        ),
        (
            (["http://a:1/metrics"], ":http", 1.0, None),
            "command line: --listen: expected HOST:PORT",
        ),
        (
            (["http://a:1/metrics", "http://a:1/other"], None, 1.0, None),
            "command line: --target: the same host:port is given twice",
        ),
        (
            (["http://a:1/metrics"], None, 0.0, None),
            "command line: --interval: must be more than 0 and at most 1h, got 0",
        ),
        (
            (["http://a:1/metrics"], None, 1.0, ["5x"]),
            "command line: --window: not a duration like 30s, 5m or 1h: '5x'",
        ),
    ],
)
def test_from_flags_errors(args, message):
    with pytest.raises(ConfigError) as info:
        from_flags(*args)
    assert message in str(info.value)


def test_serve_flag_errors_exit_2():
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "serve", "--target", "nonsense"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "command line: --target[0]: expected an http(s)://HOST:PORT/metrics URL" in proc.stderr


def test_default_name_and_redact():
    url = "https://user:pw@10.0.0.2:8443/metrics?token=abc"
    assert default_name(url) == "10.0.0.2:8443"
    assert redact(url) == "https://10.0.0.2:8443/metrics?..."
    assert "pw" not in redact(url) and "abc" not in redact(url)
    assert redact("http://h:1/metrics") == "http://h:1/metrics"


def test_a_target_without_a_path_means_its_metrics(tmp_path):
    assert from_flags(["http://10.0.0.1:8000"], None, 1.0, None).targets[0].url == (
        "http://10.0.0.1:8000/metrics"
    )
    assert from_flags(["http://h:1/"], None, 1.0, None).targets[0].url == "http://h:1/metrics"
    path = tmp_path / "c.yaml"
    path.write_text("targets:\n  - url: http://10.0.0.1:8000?token=x\n", encoding="utf-8")
    assert load(path).targets[0].url == "http://10.0.0.1:8000/metrics?token=x"
    assert (
        from_flags(["http://h:1/prometheus"], None, 1.0, None)
        .targets[0]
        .url.endswith("/prometheus")
    )  # a path given is kept as it is
