"""`specdec demo` as the README runs it: acceptance lines within 30 s (the 1m gauge once the
sidecar is a minute old), Ctrl-C stops it all;
SIGTERM and SIGHUP too, with its Prometheus child and temp dir; busy ports and a child that
dies at start are one clear message."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
from pathlib import Path
from urllib.parse import urlencode

import pytest

from exporter.demo_prometheus import log_path
from harness.helpers import free_port, http_get, need_tool, specdec, wait_for
from harness.pages import samples, value

REPO = Path(__file__).resolve().parents[2]

LINE = re.compile(r"^(voice_chat|coding_agent)\s+acceptance\s+([\d.]+)%")
REPORT = re.compile(r"^(voice_chat|coding_agent|engine)\s+acceptance")  # lines the README shows


def test_demo_shows_both_workloads_and_stops_cleanly(tmp_path: Path) -> None:
    sim_port, side_port, proxy_port = free_port(), free_port(), free_port()
    out = tmp_path / "demo.out"
    args = [
        "demo",
        "--sim-port",
        str(sim_port),
        "--sidecar-port",
        str(side_port),
        "--proxy-port",
        str(proxy_port),
        "--report-every",
        "2",
    ]
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            specdec(*args), stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            url = f"http://127.0.0.1:{side_port}/metrics"

            def latest() -> dict[str, float] | None:
                found: dict[str, float] = {}
                for line in out.read_text().splitlines():
                    if match := LINE.match(line):
                        found[match.group(1)] = float(match.group(2)) / 100
                return found if len(found) == 2 else None

            # the lines show the part of the minute seen so far, within 30 s of the start...
            per_workload = wait_for(latest, timeout=30, what="a line per workload")
            assert 0.26 < per_workload["voice_chat"] < 0.46, per_workload
            assert 0.61 < per_workload["coding_agent"] < 0.81, per_workload
            # ...the sidecar's 1m gauge once it holds a minute of history
            ratio = wait_for(
                lambda: value(
                    samples(http_get(url)), "specdec_acceptance_ratio", engine="all", window="1m"
                ),
                timeout=90,
                what="specdec_acceptance_ratio within 90 s",
            )
            assert 0.36 < ratio < 0.71  # the engine mixes both workloads
        finally:
            proc.send_signal(signal.SIGINT)  # Ctrl-C
            code = proc.wait(15)
    assert code == 0, out.read_text()[-2000:]
    assert "Traceback" not in out.read_text()
    for port in (sim_port, side_port, proxy_port):  # nothing left listening
        try:
            http_get(f"http://127.0.0.1:{port}/", timeout=1)
        except OSError:
            continue
        raise AssertionError(f"port {port} still answers after Ctrl-C")


def children_of(pid: int) -> list[int]:
    """Every process whose parent chain reaches `pid` (Prometheus runs in its own session)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        kids = [p for p, parent in parents.items() if parent == current]
        found += kids
        frontier += kids
    return found


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=str)
def test_a_stop_signal_ends_the_demo_and_its_prometheus(tmp_path: Path, sig: int) -> None:
    need_tool("prometheus")
    ports = {flag: free_port() for flag in ("--sim-port", "--sidecar-port", "--proxy-port")}
    prom_port = free_port()
    args = [x for flag, port in ports.items() for x in (flag, str(port))]
    args += ["--with-prometheus", "--prometheus-port", str(prom_port), "--speed", "5"]
    out = tmp_path / "demo.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            specdec("demo", *args), stdout=sink, stderr=subprocess.STDOUT, cwd=REPO
        )
        try:
            wait_for(
                lambda: f"prometheus       http://127.0.0.1:{prom_port}" in out.read_text(),
                timeout=60,
                what="the demo's Prometheus ready",
            )
            child = wait_for(
                lambda: next(
                    (p for p in children_of(proc.pid) if "prometheus" in cmdline(p)[0]), None
                ),
                timeout=10,
                what="the Prometheus child",
            )
            tsdb = next(a for a in cmdline(child) if a.startswith("--storage.tsdb.path="))
            temp_dir = Path(tsdb.split("=", 1)[1]).parent
            assert temp_dir.is_dir()
            proc.send_signal(sig)
            try:
                code = proc.wait(30)
            except subprocess.TimeoutExpired:
                pytest.fail(f"still running 30 s after the signal:\n{out.read_text()[-3000:]}")
        finally:
            if proc.poll() is None:
                proc.kill()
    assert code == 0, out.read_text()[-2000:]
    assert not Path(f"/proc/{child}").exists(), "Prometheus outlived the demo"
    assert not temp_dir.exists(), f"{temp_dir} left behind"
    assert not log_path(prom_port).exists(), "a clean stop keeps no Prometheus log"
    assert "Traceback" not in out.read_text()


def test_the_drop_scenarios_prometheus_holds_a_quiet_day_from_its_start(tmp_path: Path) -> None:
    """`--scenario drop --with-prometheus`: promtool backfills a quiet day before Prometheus
    starts, so the drop two minutes in is judged against a day, not against its own start."""
    need_tool("prometheus")
    need_tool("promtool")
    prom_port = free_port()
    args = ["--with-prometheus", "--prometheus-port", str(prom_port), "--scenario", "drop"]
    for flag in ("--sim-port", "--sidecar-port", "--proxy-port"):
        args += [flag, str(free_port())]
    out = tmp_path / "demo.out"
    url = f"http://127.0.0.1:{prom_port}"
    day = "specdec_route_draft_tokens_total{instance='backfill'}[1d]"
    query = f"sum by (route) (count_over_time({day}))"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            specdec("demo", *args), stdout=sink, stderr=subprocess.STDOUT, cwd=REPO
        )
        try:
            wait_for(lambda: "scenario drop: at 2:00" in out.read_text(), 60, "the drop plan")
            got = json.loads(http_get(f"{url}/api/v1/query?{urlencode({'query': query})}"))
            minutes = {r["metric"]["route"]: float(r["value"][1]) for r in got["data"]["result"]}
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert set(minutes) == {"voice_chat", "coding_agent"}, got
    assert all(n >= 1400 for n in minutes.values()), minutes  # a sample a minute, a day
    assert code == 0 and "Traceback" not in out.read_text(), out.read_text()[-2000:]


def test_with_prometheus_outside_the_repo_root_is_one_line_and_exit_2(tmp_path: Path) -> None:
    need_tool("prometheus")
    done = subprocess.run(
        specdec("demo", "--with-prometheus"), cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == (
        "specdec demo: --with-prometheus: needs the repo's prometheus.yml, not found in "
        f"{tmp_path} (run from the repo root)"
    )


def test_a_prometheus_that_dies_at_start_is_reported_with_its_log(tmp_path: Path) -> None:
    need_tool("prometheus")
    (tmp_path / "prometheus.yml").write_text("global:\n  scrape_interval: often\n")
    args = ["--with-prometheus", "--prometheus-port", str(free_port())]
    for flag in ("--sim-port", "--sidecar-port", "--proxy-port"):
        args += [flag, str(free_port())]
    done = subprocess.run(
        specdec("demo", *args), cwd=tmp_path, capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 1, done.stdout + done.stderr
    message = done.stderr
    assert "prometheus exited at start" in message and "the end of its log (" in message
    log = Path(message.split("the end of its log (", 1)[1].split(")", 1)[0])
    assert log.is_file() and "often" in log.read_text()  # Prometheus' own complaint, kept
    assert "Traceback" not in message


@pytest.mark.parametrize("flag", ["--sim-port", "--sidecar-port", "--proxy-port"])
def test_a_busy_port_is_one_line_and_exit_2(flag: str) -> None:
    ports = {f: free_port() for f in ("--sim-port", "--sidecar-port", "--proxy-port")}
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", ports[flag]))
        holder.listen()
        args = [x for f, port in ports.items() for x in (f, str(port))]
        done = subprocess.run(specdec("demo", *args), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"specdec demo: 127.0.0.1:{ports[flag]} is already in use ({flag}); "
        "stop what holds it or pick another"
    )
    assert done.stdout == ""  # checked before anything started


SCHEDULE_LINE = re.compile(
    r"^schedule\s+batch ([\d.]+) in range (\d+)-(\d+): k = (\d); drafts per step since the last "
    r"line: voice_chat ([\d.-]+), coding_agent ([\d.-]+)$"
)


@pytest.mark.parametrize(
    ("concurrency", "schedule", "k"),
    [(1, "[[1,1,3],[2,7,2],[8,256,0]]", "2"), (6, "[[1,1,3],[2,7,2],[8,256,0]]", "0")],
)
def test_the_demo_runs_a_schedule_and_shows_the_k_in_effect(
    concurrency: int, schedule: str, k: str
) -> None:
    """advise -> apply -> verify on a laptop: two clients per workload at concurrency 1 make a
    batch of about 2 (range 2-7: k = 2), 12 at concurrency 6 (range 8-256: no drafts, 0.00)."""
    ports = [str(free_port()) for _ in range(3)]
    done = subprocess.run(
        specdec("demo", "--sim-port", ports[0], "--sidecar-port", ports[1], "--proxy-port",
                ports[2], "--speed", "20", "--concurrency", str(concurrency), "--report-every",
                "2", "--duration", "9", "--schedule", schedule),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [m for line in done.stdout.splitlines() if (m := SCHEDULE_LINE.match(line))]
    assert len(lines) >= 3, done.stdout
    for m in lines[1:]:  # the first may hold the ramp-up
        assert m.group(4) == k, done.stdout
        # a request alone for a step (its partner between requests) drafts the band-1 k
        assert abs(float(m.group(5)) - int(k)) < 0.15, done.stdout
        assert abs(float(m.group(6)) - int(k)) < 0.15, done.stdout


def test_a_bad_schedule_is_one_line_and_exit_2() -> None:
    done = subprocess.run(
        specdec("demo", "--schedule", "[[2,4,3]]"), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("specdec demo: --schedule: range 1: [2, 4, ...] must start at 1")
    assert len(done.stderr.strip().splitlines()) == 1


# ---- the README's quick start, verbatim ---------------------------------------------------


def bash_block(heading: str) -> str:
    """The first bash block under the README's `## heading`."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, f"{heading}: no bash block"
    return block.group(1)


def shape(line: str) -> str:
    """A demo line without its figures: what the README shows and the program prints alike."""
    return re.sub(r"\s+", " ", re.sub(r"\d+(\.\d+)?", "N", line)).strip()


def readme_sample_shapes() -> set[str]:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```(\w*)\n(.*?)^```$", section, re.S | re.M)
    lines = [ln for lang, body in blocks if not lang for ln in body.splitlines()]
    return {shape(ln) for ln in lines if REPORT.match(ln)}


@pytest.mark.timeout(1200)  # the venv, the demo, then the test extras and a collection
def test_the_quick_start_runs_verbatim_in_a_fresh_venv(tmp_path: Path) -> None:
    """The block on a PEP 668 system Python: a bare environment (system PATH, an empty HOME, no
    virtualenv), the block's own venv and pip install, then `specdec demo` printing lines shaped
    as the README's sample. `<this repo>` is the only substitution (this checkout's commits).
    Then the Tests section's block in the quick start's venv and directory, collecting."""
    for port in (8000, 8001, 10419):  # the demo's defaults, as a newcomer runs it
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} is busy"
    script = bash_block("Quick start").replace("<this repo>", str(REPO))
    assert script.count("\n") <= 5 and "specdec demo" in script
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    out = tmp_path / "quickstart.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            ["bash", "-e", "-c", script],
            cwd=tmp_path,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            sample = readme_sample_shapes()
            assert len(sample) == 3, sample

            def like_the_readme() -> dict[str, str] | None:
                """Each name's latest line, once all three are shaped as the README's sample
                (a route's first line, from one request, has no interval yet)."""
                lines = out.read_text(errors="replace").splitlines()
                latest = {ln.split(" ", 1)[0]: shape(ln) for ln in lines if REPORT.match(ln)}
                return latest if len(latest) == 3 and set(latest.values()) == sample else None

            wait_for(like_the_readme, timeout=240, what="the demo's lines as the README shows")
            # the install a newcomer gets is the fast one: its sidecar's page says so
            page = http_get("http://127.0.0.1:10419/metrics")
            runtime = next(ln for ln in page.splitlines() if ln.startswith("specdec_runtime_"))
            assert 'event_loop="uvloop"' in runtime and 'http_parser="httptools"' in runtime
        finally:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, as the block says
            code = proc.wait(30)
    text = out.read_text(errors="replace")
    assert code == 0, text[-3000:]
    assert (tmp_path / "specdec" / ".venv" / "bin" / "specdec").is_file()  # the block's own venv
    assert "Traceback" not in text and "externally-managed" not in text
    # the Tests block as it says, but collecting instead of running: the fast tier itself runs
    # in this same CI (run twice it cost minutes and showed nothing more); what only this can
    # show is that the block installs the test extras and every test imports in a fresh venv
    tests = subprocess.run(
        ["bash", "-e", "-c", ". .venv/bin/activate\n" + bash_block("Tests")],
        cwd=tmp_path / "specdec",
        env={**env, "PYTEST_ADDOPTS": "--collect-only"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert tests.returncode == 0, (tests.stdout + tests.stderr)[-3000:]
    collected = re.search(r"(\d+) tests collected in", tests.stdout)  # no "errors" among them
    assert collected and int(collected.group(1)) > 900, tests.stdout[-3000:]
