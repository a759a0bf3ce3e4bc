"""The real `dagster dev -w workspace.yaml` on 127.0.0.1, loaded in headless Chromium: the
global asset graph draws the UPI job asset upstream of its sink-table asset. The test saves a
screenshot of the page (its path is printed; a copy goes to tests/artifacts/, gitignored).

Only the definitions load: no Spark runs. Chromium comes from Debian (`platform/bootstrap.sh dev`
installs it through platform/install-chromium.sh).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.conftest import ROOT, VENV_BIN

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "tests" / "artifacts"
JOB_ASSET = "upi_per_minute"
SINK_ASSET = "upi_counts"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0

# Without the background-networking flags Chromium waits for Google services on this closed
# network; a fresh --user-data-dir per run keeps state (and the onboarding) out of it.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--window-size=1400,900",
]

# Instance settings: no telemetry, and no "Join the Dagster community" dialog over the graph.
DAGSTER_YAML = "telemetry:\n  enabled: false\nnux:\n  enabled: false\n"

ASSET_NODES_QUERY = "{ assetNodes { assetKey { path } } }"


def _chromium() -> Path:
    if CHROMIUM.exists():
        return CHROMIUM
    script = ROOT / "platform" / "install-chromium.sh"
    out = subprocess.run([str(script)], capture_output=True, text=True, timeout=600)
    if out.returncode != 0 or not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing and could not be installed: {out.stderr.strip()}")
    return CHROMIUM


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _default_signals() -> None:
    # A process started with `cmd &` by a non-interactive shell inherits SIGINT as *ignored*, and
    # dagster copies SIGINT's disposition onto SIGTERM (setup_interrupt_handlers): such a
    # `dagster dev` ignores both and cannot be stopped. Give the child default dispositions.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _group_members(pgid: int) -> list[str]:
    """Live (non-zombie) processes of a process group, as 'pid command' strings."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        # Fields after the ")" that closes the command name: state ppid pgrp ...
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            members.append(f"{entry.name} {cmd[:120]}")
    return members


def _stop_group(proc: subprocess.Popen, timeout: float) -> list[str]:
    """Stop a process group led by ``proc``: SIGINT first (dagster dev shuts its webserver,
    daemon and code servers down), SIGKILL for whatever is left. Returns the survivors."""
    pgid = proc.pid
    if proc.poll() is None:
        os.killpg(pgid, signal.SIGINT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    deadline = time.monotonic() + timeout
    while _group_members(pgid) and time.monotonic() < deadline:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            break
        time.sleep(0.1)  # poll: killed processes take a moment to exit
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=timeout)
    return _group_members(pgid)


@dataclass
class DagsterDev:
    url: str
    log: Path


def _graphql(url: str, query: str) -> dict:
    req = urllib.request.Request(
        f"{url}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.load(resp)


def _wait_until_serving(proc: subprocess.Popen, url: str, log: Path) -> None:
    """Poll until the webserver answers GraphQL with the workspace's assets loaded."""
    deadline = time.monotonic() + START_TIMEOUT_S
    last = "no answer yet"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"dagster dev exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            nodes = _graphql(url, ASSET_NODES_QUERY)["data"]["assetNodes"]
            keys = {"/".join(n["assetKey"]["path"]) for n in nodes}
            if {JOB_ASSET, SINK_ASSET} <= keys:
                return
            last = f"assets so far: {sorted(keys)}"
        except (OSError, urllib.error.URLError, KeyError, TypeError, ValueError) as e:
            last = repr(e)
        time.sleep(0.25)  # polling interval, not synchronisation: the loop checks the server
    pytest.fail(f"dagster dev did not serve the assets in {START_TIMEOUT_S:.0f} s ({last}):\n"
                f"{log.read_text()[-4000:]}")


@pytest.fixture
def dagster_dev(tmp_path: Path) -> Iterator[DagsterDev]:
    home = tmp_path / "dagster-home"
    home.mkdir()
    (home / "dagster.yaml").write_text(DAGSTER_YAML)
    srt_home = tmp_path / "srt-home"
    srt_home.mkdir()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "SRT_HOME": str(srt_home),
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "dagster-dev.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(VENV_BIN / "dagster"), "dev", "-w", str(ROOT / "workspace.yaml"),
             "-h", "127.0.0.1", "-p", str(port)],
            cwd=tmp_path,  # the definitions' relative data paths (srt-data/...) land here
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, killed as a whole in teardown
            preexec_fn=_default_signals,
        )
    try:
        _wait_until_serving(proc, url, log)
        yield DagsterDev(url, log)
    finally:
        survivors = _stop_group(proc, STOP_TIMEOUT_S)
        assert not survivors, f"dagster dev left processes behind: {survivors}"


class _GraphNodes(HTMLParser):
    """Text inside each SVG <foreignObject> (one per drawn asset node) and its x position."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: list[tuple[float, str]] = []
        self._depth = 0
        self._x = 0.0
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "foreignobject":
            self._depth += 1
            if self._depth == 1:
                self._x = float(dict(attrs).get("x") or 0)
                self._text = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "foreignobject" and self._depth:
            self._depth -= 1
            if self._depth == 0:
                self.nodes.append((self._x, " ".join(self._text)))

    def handle_data(self, data: str) -> None:
        if self._depth and data.strip():
            self._text.append(data.strip())


def _node_x(nodes: list[tuple[float, str]], asset: str) -> float | None:
    for x, text in nodes:
        if asset in text.split():
            return x
    return None


def _render(chromium: Path, url: str, workdir: Path, attempt: int) -> tuple[str, Path, str]:
    """One headless Chromium run: the DOM after the page settled, and a screenshot."""
    shot = workdir / f"asset-graph-{attempt}.png"
    profile = workdir / f"chromium-profile-{attempt}"
    args = [
        str(chromium), *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
        # Virtual time runs only while no request is pending: the page's GraphQL queries
        # finish, then 15 s of page time (layout, zoom-to-fit) elapse instantly.
        "--virtual-time-budget=15000",
        "--dump-dom", f"--screenshot={shot}", url,
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        dom, err = proc.communicate(timeout=60)
    finally:
        survivors = _stop_group(proc, 10)  # renderer/zygote helpers share the group
    assert not survivors, f"Chromium left processes behind: {survivors}"
    return dom.decode(errors="replace"), shot, err.decode(errors="replace")


@pytest.mark.timeout(180)
def test_asset_graph_shows_the_job_and_its_sink_table(dagster_dev: DagsterDev, tmp_path: Path):
    chromium = _chromium()
    page = f"{dagster_dev.url}/asset-groups"  # "Global asset lineage"
    started = time.monotonic()
    nodes: list[tuple[float, str]] = []
    shot = tmp_path / "none.png"
    err = ""
    for attempt in range(1, 4):  # the UI may still be fetching on a busy machine: render again
        dom, shot, err = _render(chromium, page, tmp_path, attempt)
        parser = _GraphNodes()
        parser.feed(dom)
        nodes = parser.nodes
        if _node_x(nodes, JOB_ASSET) is not None and _node_x(nodes, SINK_ASSET) is not None:
            break
    print(f"\nrendered {page} in {time.monotonic() - started:.1f} s; graph nodes: {nodes}")

    assert shot.exists(), f"Chromium wrote no screenshot:\n{err[-3000:]}"
    ARTIFACTS.mkdir(exist_ok=True)
    copy = ARTIFACTS / "dagster-asset-graph.png"
    shutil.copyfile(shot, copy)
    print(f"screenshot: {shot}\ncopy: {copy}")

    job_x, sink_x = _node_x(nodes, JOB_ASSET), _node_x(nodes, SINK_ASSET)
    assert job_x is not None and sink_x is not None, (
        f"the asset graph does not draw {JOB_ASSET} and {SINK_ASSET}: nodes {nodes}\n"
        f"{err[-3000:]}"
    )
    # The graph is laid out left to right: the job feeds the table it writes.
    assert job_x < sink_x, nodes
