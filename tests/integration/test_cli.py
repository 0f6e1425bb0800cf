"""The command line as a user types it."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.core.counts import Counts
from harness.helpers import child, free_port, http_get, specdec, wait_for
from harness.pages import samples, value
from tests.fakevllm import FakeVllm, serve_fake


def test_zero_config_serve(tmp_path: Path) -> None:
    fake, fake_port, port = FakeVllm(step=Counts(4, 12, 3, (2, 1, 0))), free_port(), free_port()
    args = ["serve", "--target", f"http://127.0.0.1:{fake_port}/metrics"]
    # a window's gauges appear once the sidecar is as old as it
    args += ["--listen", f"127.0.0.1:{port}", "--interval", "0.1", "--window", "3s"]
    with serve_fake(fake, fake_port), child(specdec(*args), tmp_path / "log"):
        url = f"http://127.0.0.1:{port}/metrics"
        got = wait_for(
            lambda: value(
                samples(http_get(url)), "specdec_acceptance_ratio", engine="0", window="3s"
            ),
            what="acceptance gauge",
        )
        assert got == pytest.approx(0.25)
        assert (
            value(samples(http_get(url)), "specdec_target_up", target=f"127.0.0.1:{fake_port}") == 1
        )


@pytest.mark.parametrize("verb", ["serve", "derive"])
def test_help_explains_every_flag(verb: str) -> None:
    out = subprocess.run(specdec(verb, "--help"), capture_output=True, text=True, check=True).stdout
    flags = {
        "serve": ["--config", "--target", "--listen", "--interval", "--window", "--log-level"],
        "derive": ["--json", "--engine", "--prefix"],
    }[verb]
    for flag in flags:
        line = next(line for line in out.splitlines() if line.strip().startswith(flag))
        assert len(out.split(flag, 1)[1].split("\n  -")[0].split()) > 3, (
            f"{flag} has no explanation: {line}"
        )


def test_usage_errors_exit_2() -> None:
    for args in (
        ["serve"],
        ["serve", "--target", "ftp://x/metrics"],
        ["serve", "--target", "http://h:1/m", "--listen", "nope"],
    ):
        result = subprocess.run(specdec(*args), capture_output=True, text=True)
        assert result.returncode == 2, args
        assert "config error" in result.stderr and "--" in result.stderr


def test_sim_profile_flags_are_checked() -> None:
    for bad in ("code_agent=1.5", "code_agent=0.7:0", "code_agent=x", "=0.5"):
        result = subprocess.run(specdec("sim", "--profile", bad), capture_output=True, text=True)
        assert result.returncode == 2, bad
        assert "specdec sim: bad arguments" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=str)
@pytest.mark.parametrize("verb", ["serve", "sim"])
def test_long_running_verbs_stop_on_every_stop_signal(tmp_path: Path, verb: str, sig: int) -> None:
    port = free_port()
    if verb == "serve":
        args = [
            "serve",
            "--target",
            f"http://127.0.0.1:{free_port()}",
            "--listen",
            f"127.0.0.1:{port}",
        ]
    else:
        args = ["sim", "--listen", f"127.0.0.1:{port}"]
    with child(specdec(*args), tmp_path / "log") as proc:
        wait_for(lambda: http_get(f"http://127.0.0.1:{port}/metrics"), 30, f"{verb} up")
        proc.send_signal(sig)
        if verb == "serve" and sig == signal.SIGHUP:  # serve reloads on SIGHUP (nginx's way)
            wait_for(lambda: "config reloaded" in (tmp_path / "log").read_text(), 15, "reload")
            assert proc.poll() is None
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(15)
    log = (tmp_path / "log").read_text()
    assert code == 0, log[-2000:]
    assert "Traceback" not in log


def test_a_ctrl_c_while_the_verbs_load_is_one_line_and_exit_130() -> None:
    """The first ~0.4 s of every command is importing its verbs. An interrupt there (here raised
    by an import hook the moment aiohttp is imported, so it lands there every time) must not
    print the import's traceback."""
    hook = (
        "import sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'aiohttp':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "from exporter.cli import main\n"
        "raise SystemExit(main(['measure', '--help']))\n"
    )
    result = subprocess.run([sys.executable, "-c", hook], capture_output=True, text=True)
    assert result.returncode == 130, result.stderr
    assert result.stderr == "specdec: interrupted\n"


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (
            ["serve", "--target", "http://127.0.0.1:1/metrics", "--listen", "127.0.0.1:{port}"],
            "--listen",
        ),
        (["sim", "--listen", "127.0.0.1:{port}"], "--listen"),
    ],
)
def test_a_busy_listen_address_is_one_line_and_exit_2(args: list[str], where: str) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run(
            specdec(*(a.format(port=port) for a in args)),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert f"127.0.0.1:{port} is already in use ({where})" in line, line


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            [
                "measure",
                "--base-url",
                "http://127.0.0.1:9",
                "--scenario",
                "ja_chat",
                "--plot",
                "/nonexistent-dir/x.png",
            ],
            "specdec measure: --plot /nonexistent-dir/x.png: cannot write there",
        ),
        (["serve", "--bogus"], "usage: specdec serve "),
        (["derive", "nope.prom", "after.prom"], "specdec derive: cannot read nope.prom"),
        (["sim", "--profile", "bad"], "specdec sim: bad arguments: --profile 'bad': wants NAME="),
        (["sim", "--profile", "nosuch=0.5"], "no profile 'nosuch', the profiles are code_agent"),
        (["sim", "--speed", "0"], "specdec sim: bad arguments: --speed must be > 0, got 0.0"),
        (["demo", "--duration", "-1"], "specdec demo: --duration must be > 0, got -1.0"),
        (["advise", "--sidecar", "nope"], "specdec advise: --sidecar wants http(s)://HOST:PORT"),
    ],
    ids=lambda x: x if isinstance(x, str) else " ".join(x[:2]),
)
def test_a_bad_command_line_is_one_named_line_and_exit_2(args: list[str], line: str) -> None:
    """What a newcomer typed wrong, found before any work: exit 2, the verb and the flag or
    file named on stderr's first line (the verb's own usage for an unknown flag), no trace."""
    result = subprocess.run(specdec(*args), capture_output=True, text=True, timeout=60)
    first = result.stderr.splitlines()[0] if result.stderr else ""
    assert result.returncode == 2 and line in first, result.stderr
    assert "Traceback" not in result.stderr and not result.stdout


def test_derive_of_the_same_page_twice_says_nothing_changed() -> None:
    page = str(Path(__file__).resolve().parents[1] / "fixtures" / "real-llamacpp.prom")
    out = subprocess.run(specdec("derive", page, page, "--engine", "llamacpp"),
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0
    assert "nothing changed between" in out.stderr
