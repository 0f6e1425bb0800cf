"""`specdec demo --with-prometheus`: Debian's `prometheus` as a child of the demo, with the
repo's rules, scraping the demo's own ports. Its TSDB lives in a temp dir removed at exit; its
output goes to a log file, so a Prometheus that dies at start is reported with the end of that
log and the file's name; after a clean run the log is removed. Given a history (OpenMetrics,
exporter/demo_history.py), promtool writes it into the TSDB first."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml

from exporter.demo_history import BackfillFailed, backfill

READY_SECONDS = 30.0
TAIL_LINES = 15


class ChildFailed(Exception):
    """A child process that did not come up: `str()` is the message, its log's end included."""


def log_path(port: int) -> Path:
    return Path(tempfile.gettempdir()) / f"specdec-demo-prometheus-{port}.log"


def _config(repo_config: Path, host: str, ports: dict[str, int]) -> dict[str, Any]:
    """The repo's prometheus.yml pointed at the demo: its jobs on the demo's ports, its rule
    files as absolute paths, no Alertmanager (the demo runs none)."""
    config: dict[str, Any] = yaml.safe_load(repo_config.read_text(encoding="utf-8"))
    root = repo_config.resolve().parent
    config["rule_files"] = [str(root / pattern) for pattern in config.get("rule_files", [])]
    config.pop("alerting", None)
    for job in config.get("scrape_configs", []):
        port = ports.get(job["job_name"])
        if port is not None:
            job["static_configs"] = [{"targets": [f"{host}:{port}"]}]
    return config


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _tail(path: Path) -> str:
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(f"  {line}" for line in lines[-TAIL_LINES:]) or "  (empty)"


@contextlib.asynccontextmanager
async def prometheus_child(
    host: str,
    port: int,
    scrape_ports: dict[str, int],
    repo_config: Path = Path("prometheus.yml"),
    history: str | None = None,
) -> AsyncIterator[str | None]:
    """Yield Prometheus' URL once it is ready; None (with a line printed) when it cannot run
    here; ChildFailed when it exits at start or its history cannot be written. Ended (and its
    TSDB removed) on the way out."""
    binary, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if binary is None or not repo_config.exists() or (history is not None and promtool is None):
        print(
            "--with-prometheus: needs `prometheus` and `promtool` on PATH (Debian: apt-get "
            "install prometheus) and ./prometheus.yml (run from the repo root); going on without it"
        )
        yield None
        return
    log = log_path(port)
    with tempfile.TemporaryDirectory(prefix="specdec-demo-prometheus-") as tmp:
        config = Path(tmp) / "prometheus.yml"
        config.write_text(yaml.safe_dump(_config(repo_config, host, scrape_ports)))
        if history is not None:
            assert promtool is not None
            try:
                await backfill(history, Path(tmp) / "tsdb", promtool)
            except BackfillFailed as exc:
                raise ChildFailed(f"prometheus' history: {exc}") from None
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={Path(tmp) / 'tsdb'}",
                    f"--web.listen-address={host}:{port}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: our signals are ours to pass on
            )
        url = f"http://{host}:{port}"
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + READY_SECONDS
            while not await asyncio.to_thread(_ready, url):
                if proc.poll() is not None:
                    raise ChildFailed(
                        f"prometheus exited at start (code {proc.returncode}); "
                        f"the end of its log ({log}):\n{_tail(log)}"
                    )
                if loop.time() > deadline:
                    raise ChildFailed(
                        f"prometheus was not ready within {READY_SECONDS:.0f} s; "
                        f"the end of its log ({log}):\n{_tail(log)}"
                    )
                await asyncio.sleep(0.2)
            yield url
        except BaseException:
            _stop(proc)
            raise  # its log stays, named in the message
        _stop(proc)
        log.unlink(missing_ok=True)  # a clean run leaves nothing behind


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
