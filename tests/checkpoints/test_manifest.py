"""A savepoint manifest is never trusted over the checksummed files it describes.

One real savepoint of the UPI job (Spark, once per module); every case edits a copy of its
manifest. The property: any single-field edit — with the manifest's own checksum left as it
was, or recomputed as someone who knows the format would — is refused with a clear error, or
restores exactly the checkpoint the unedited manifest restores (the edit was harmless).
"""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from upi_events import events, oracle

from stateful_runtime.checkpoints import manifest, restore, savepoints
from stateful_runtime.checkpoints.manifest import ManifestMismatchError
from stateful_runtime.exceptions import SavepointError
from stateful_runtime.runtime.loader import load_job_file
from stateful_runtime.runtime.runner import JobRunner
from tests.helpers import EXAMPLES, UpiWorkspace, append_lines, srt

pytestmark = pytest.mark.slow

LINES = list(events(8_000, merchants=12, rate_per_s=200, disorder_ms=2_000, seed=23))
QUERY = "upi-counts"


def _run(ws: UpiWorkspace, ckpt: Path | None = None, **runner_args: Any) -> str:
    sets = {
        "source.log_dir": str(ws.log_dir),
        "sink.database": str(ws.database),
        "checkpoint.dir": str(ckpt or ws.checkpoint_dir),
        "source.max_records_per_batch": "2000",
        "parallelism": "2",
    }
    jf = load_job_file(EXAMPLES / "upi_per_minute.py", sets)
    out = io.StringIO()
    code = JobRunner(jf, available_now=True, out=out, **runner_args).run()
    assert code == 0, out.getvalue()
    return out.getvalue()


@pytest.fixture(scope="module")
def made(
    spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[UpiWorkspace, Path]]:
    """The UPI job run over every line in batches of 2,000, and one savepoint of it."""
    from stateful_runtime.connectors.eventlog import EventLog

    ws = UpiWorkspace(tmp_path_factory.mktemp("upi"))
    EventLog(ws.log_dir).create_topic("upi-payments", ws.partitions)
    append_lines(ws.log_dir, LINES)
    _run(ws)
    assert ws.table() == oracle(LINES)
    sp = savepoints.create(ws.checkpoint_dir, ws.root / "savepoints")
    assert sp.manifest["queries"][QUERY]["batch"] >= 3
    yield ws, Path(sp.location)


def _edit(location: Path, change: Any, *, reseal: bool) -> None:
    path = location / manifest.MANIFEST
    data = json.loads(path.read_text())
    change(data)
    if reseal:
        data = manifest.seal(data)
    path.write_text(json.dumps(data, indent=1))


def test_an_edited_batch_is_refused_before_the_sink_is_rewound(made, tmp_path):
    """The reported case: the manifest's batch set back (checksum recomputed, so only the
    files can tell) used to rewind the sink to it while Spark resumed after the real batch:
    the payments of the batches between were gone, exit 0. Now `srt run --from-savepoint`
    refuses, names the field and both values, and the table is untouched."""
    ws, original = made
    copy = tmp_path / "sp" / original.name
    shutil.copytree(original, copy)
    real = json.loads((copy / manifest.MANIFEST).read_text())["queries"][QUERY]["batch"]

    def back_to_zero(m: dict) -> None:
        m["queries"][QUERY]["batch"] = 0

    _edit(copy, back_to_zero, reseal=True)
    before = ws.table()
    with pytest.raises(ManifestMismatchError) as err:
        _run(ws, tmp_path / "restored", from_savepoint=str(copy))
    assert {
        "field": f"queries.{QUERY}.batch",
        "manifest": "0",
        "files": f"{real} (the newest commit)",
    } in err.value.mismatches
    assert "put the value back" in str(err.value)
    assert "srt savepoint list" in str(err.value)
    assert ws.table() == before == oracle(LINES)

    # An edit without recomputing the checksum: the checksum names it too.
    def back_to_one(m: dict) -> None:
        m["queries"][QUERY]["batch"] = 1

    _edit(copy, back_to_one, reseal=False)
    with pytest.raises(ManifestMismatchError, match="manifest_sha256"):
        restore.restore(savepoints.resolve(str(copy)), tmp_path / "ck", real_fingerprint(copy))


def real_fingerprint(location: Path) -> dict:
    return json.loads((location / manifest.MANIFEST).read_text())["fingerprint"]


def test_describe_and_check_show_what_the_files_say(made, tmp_path, srt_env):
    """`srt savepoint describe` prints the mismatches with the rest (exit 2); `srt savepoint
    check` refuses; an intact savepoint shows none."""
    _, original = made
    copy = tmp_path / "sp" / original.name
    shutil.copytree(original, copy)
    intact = srt(["savepoint", "describe", str(copy)], srt_env)
    assert intact.returncode == 0, intact.stderr
    assert json.loads(intact.stdout)["manifest_mismatches"] == []

    def later_watermark(m: dict) -> None:
        m["queries"][QUERY]["watermark_ms"] += 60_000

    _edit(copy, later_watermark, reseal=True)
    shown = srt(["savepoint", "describe", str(copy)], srt_env)
    assert shown.returncode == 2
    (mismatch,) = json.loads(shown.stdout)["manifest_mismatches"]
    assert mismatch["field"] == f"queries.{QUERY}.watermark_ms"
    assert f"queries.{QUERY}.watermark_ms: the manifest says" in shown.stderr
    checked = srt(
        ["savepoint", "check", str(EXAMPLES / "upi_per_minute.py"), str(copy), "--json"], srt_env
    )
    assert checked.returncode == 2
    error = json.loads(checked.stderr.strip().splitlines()[-1])["error"]
    assert error["type"] == "ManifestMismatchError"
    assert error["mismatches"] == [mismatch]

    # Edited without the checksum recomputed: `list` leaves it out and says why.
    _edit(copy, later_watermark, reseal=False)
    listed = srt(["savepoint", "list", "--target", str(copy.parent)], srt_env)
    assert listed.returncode == 0 and listed.stdout.strip() == "no savepoints"
    assert "not listed" in listed.stderr and "manifest_sha256" in listed.stderr


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every field of a manifest, inner ones included, as a key path."""
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _apply(data: dict, path: tuple, how: str, other: Any) -> None:
    parent: Any = data
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    old = parent[last]
    if how == "delete":
        del parent[last]
    elif how == "nudge" and isinstance(old, int) and not isinstance(old, bool):
        parent[last] = old + (1 if other else -1)
    elif how == "nudge" and isinstance(old, str) and old:
        parent[last] = old[:-1] + ("0" if old[-1] != "0" else "1")
    else:
        parent[last] = other


VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 10_000),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.lists(st.integers(0, 3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


class Baseline:
    """A writable copy of the savepoint, its manifest, and what it restores to."""

    def __init__(self, copy: Path, ckpt: Path) -> None:
        self.copy, self.ckpt = copy, ckpt
        self.manifest = json.loads((copy / manifest.MANIFEST).read_text())
        sp = savepoints.resolve(str(copy))
        self.result = restore.restore(sp, ckpt, self.manifest["fingerprint"])
        self.tree = _tree(ckpt)

    def __repr__(self) -> str:
        return f"Baseline({self.copy})"


@pytest.fixture(scope="module")
def baseline(made, tmp_path_factory) -> Baseline:
    _, original = made
    work = tmp_path_factory.mktemp("edits")
    shutil.copytree(original, work / "sp" / original.name)
    return Baseline(work / "sp" / original.name, work / "ck")


def _tree(ckpt: Path) -> dict:
    files = {p.relative_to(ckpt).as_posix(): p.read_bytes() for p in ckpt.rglob("*") if p.is_file()}
    marker = json.loads(files.pop("_job.json"))
    marker.pop("created_at")
    return {**files, "_job.json": marker}


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), how=st.sampled_from(["replace", "nudge", "delete"]), reseal=st.booleans())
def test_any_single_field_edit_is_refused_or_harmless(baseline, data, how, reseal):
    copy, ckpt, original = baseline.copy, baseline.ckpt, baseline.manifest
    path = data.draw(st.sampled_from(_paths(original)), label="field")
    other = data.draw(VALUES, label="value")
    edited = json.loads(json.dumps(original))
    _apply(edited, path, how, other)
    if edited == original:
        return
    if reseal:
        edited = manifest.seal(edited)
    (copy / manifest.MANIFEST).write_text(json.dumps(edited))
    shutil.rmtree(ckpt, ignore_errors=True)
    try:
        sp = savepoints.resolve(str(copy))
        got = restore.restore(sp, ckpt, original["fingerprint"])
    except SavepointError as exc:
        assert str(exc).strip() and "savepoint" in str(exc)
        if isinstance(exc, ManifestMismatchError):
            assert exc.mismatches and all(m["field"] and m["files"] for m in exc.mismatches)
        assert not ckpt.exists()  # nothing laid out
        return
    finally:
        (copy / manifest.MANIFEST).write_text(json.dumps(original, indent=1))
    # Restored: then the edit changed nothing that matters.
    assert got == baseline.result
    assert _tree(ckpt) == baseline.tree


def test_an_unedited_manifest_is_sealed_and_true(made):
    _, original = made
    sp = savepoints.resolve(str(original))
    assert manifest.SEAL in sp.manifest and manifest.check(sp) == []


def test_an_edited_fingerprints_sources_are_named_whatever_they_hold():
    """A resealed manifest whose sources were replaced by null or a number (Hypothesis found
    it through the test above) is named as changed, not a TypeError."""
    from stateful_runtime.checkpoints.restore import changed_sources

    new = {"queries": {"q": {"sources": ["payments"]}}}
    for edited in ([None], 7, ["payments", 3]):
        [(query, what)] = changed_sources({"queries": {"q": {"sources": edited}}}, new)
        assert query == "q" and "now reads payments" in what
    assert changed_sources(new, new) == []
