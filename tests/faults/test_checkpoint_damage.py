"""A damaged checkpoint file, on a real checkpoint of a short real run of the UPI job.

Each case damages one file of a copy of that checkpoint — truncated, overwritten with garbage,
emptied or deleted (and a one-digit edit only the Hadoop checksum notices) — and checks what
:func:`verify.verify` names and what :func:`recovery.recover` does: damage confined to the newest
batch is moved aside (never deleted) and the job falls back to the previous committed batch;
damage a restart at that batch needs as well refuses, naming the file and the newest savepoint.
The last tests restart Spark on damaged checkpoints: the result equals the oracle.
"""

from __future__ import annotations

import io
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from upi_events import events, oracle

from stateful_runtime.checkpoints import recovery, savepoints
from stateful_runtime.checkpoints.layout import CheckpointLayout, QueryLayout
from stateful_runtime.checkpoints.verify import verify
from stateful_runtime.connectors.eventlog import EventLog
from stateful_runtime.runtime.loader import load_job_file
from stateful_runtime.runtime.runner import JobRunner
from tests.faults.harness import DAMAGE, QUERY, compare, damage, duckdb_counts
from tests.helpers import EXAMPLES, UpiWorkspace, append_lines

pytestmark = pytest.mark.faults

FIRST = list(events(6_000, merchants=20, rate_per_s=200, disorder_ms=3_000, bad_every=499, seed=3))
MORE = list(
    events(
        3_000,
        merchants=20,
        rate_per_s=200,
        disorder_ms=3_000,
        bad_every=499,
        seed=4,
        start_ms=1_767_225_600_000 + 30_000,
    )
)
DAMAGE_PLUS = (*DAMAGE, "digit")


# How each case appears in RELIABILITY.md (fault = the file damaged and what must happen).
CASES = {
    "test_a_sound_checkpoint_has_no_problems_and_nothing_moves": (
        "sound checkpoint: nothing named, nothing moved"
    ),
    "test_newest_commit_damaged_reruns_that_batch_from_the_previous_state": (
        "newest commits/N damaged: batch N re-run from N-1"
    ),
    "test_damaged_planned_batch_is_planned_again_and_the_sink_rewound": (
        "planned offsets/N (uncommitted) damaged: planned again, sink rewound"
    ),
    "test_damaged_offsets_of_the_newest_commit_fall_back_one_batch": (
        "offsets/N of the newest commit damaged: back to N-1, sink rewound"
    ),
    "test_damaged_older_offsets_a_restart_needs_are_refused_naming_the_savepoint": (
        "older offsets/N-1 damaged: refused, savepoint named"
    ),
    "test_damaged_older_state_file_is_refused_naming_file_and_savepoint": (
        "older state changelog damaged: refused, savepoint named"
    ),
    "test_damaged_newest_state_version_falls_back_one_batch": (
        "newest state changelog damaged: batch N re-run from N-1"
    ),
    "test_refusal_without_savepoint_or_mirror_says_how_to_start_over": (
        "damage refused without savepoint: says how to start over / the mirror"
    ),
    "test_a_start_that_stops_before_rewinding_leaves_the_rewind_to_the_next": (
        "crash between the fallback and the sink rewind: next start rewinds"
    ),
    "test_damaged_query_metadata_is_moved_aside": ("query metadata damaged: moved aside"),
    "test_restart_on_a_damaged_checkpoint_equals_oracle": (
        "restart of Spark on a damaged checkpoint = oracle"
    ),
}


@pytest.fixture(autouse=True)
def _record_case(request: pytest.FixtureRequest, trials):
    """Each case is a trial in RELIABILITY.md: the damage is its input class."""
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is None or rep.skipped:
        return
    params = getattr(request.node, "callspec", None)
    params = params.params if params else {}
    what = f"file {params['how']}" if "how" in params else params.get("case", "as written")
    trials.record(
        fault=f"checkpoint: {CASES[request.node.originalname]}",
        input=f"real UPI checkpoint, {what}",
        result="pass" if rep.passed else "FAIL",
        detail="" if rep.passed else str(rep.longrepr)[-400:],
    )


@dataclass
class Base:
    ws: UpiWorkspace
    savepoint_root: Path
    savepoint_id: str

    @property
    def qdir(self) -> Path:
        return self.ws.checkpoint_dir / QUERY


def _sets(ws: UpiWorkspace, sp_root: Path) -> dict[str, str]:
    return {
        "source.log_dir": str(ws.log_dir),
        "sink.database": str(ws.database),
        "checkpoint.dir": str(ws.checkpoint_dir),
        "savepoint.dir": str(sp_root),
        "source.max_records_per_batch": "1500",
        "parallelism": "2",
    }


def _run(ws: UpiWorkspace, sp_root: Path) -> tuple[int, str]:
    out = io.StringIO()
    jf = load_job_file(EXAMPLES / "upi_per_minute.py", _sets(ws, sp_root))
    code = JobRunner(jf, available_now=True, out=out).run()
    return code, out.getvalue()


@pytest.fixture(scope="module")
def base(spark, tmp_path_factory: pytest.TempPathFactory) -> Base:
    """A real checkpoint: 6,000 events in batches of 1,500, then a savepoint of it."""
    ws = UpiWorkspace(tmp_path_factory.mktemp("damage-base"), partitions=2)
    EventLog(ws.log_dir).create_topic("upi-payments", ws.partitions)
    append_lines(ws.log_dir, FIRST)
    sp_root = ws.root / "savepoints"
    code, out = _run(ws, sp_root)
    assert code == 0, out
    assert duckdb_counts(ws.database) == oracle(FIRST)
    sp = savepoints.create(ws.checkpoint_dir, sp_root)
    assert QueryLayout(ws.checkpoint_dir / QUERY).last_committed() >= 3
    return Base(ws, sp_root, sp.id)


@pytest.fixture
def copy(base: Base, tmp_path: Path) -> Base:
    """A private copy of the base workspace (log, sink, checkpoint, savepoints)."""
    root = tmp_path / "w"
    shutil.copytree(base.ws.root, root)
    return Base(UpiWorkspace(root, partitions=2), root / "savepoints", base.savepoint_id)


def _recover(b: Base) -> recovery.Recovery:
    return recovery.recover(
        b.ws.checkpoint_dir,
        [QUERY],
        job_file="examples/upi_per_minute.py",
        savepoint_dir=str(b.savepoint_root),
    )


def _tree(d: Path) -> list[str]:
    return sorted(p.relative_to(d).as_posix() for p in d.rglob("*"))


def _damage(path: Path, how: str) -> None:
    if how == "digit":  # still parses; only the checksum file tells
        text = path.read_text()
        i = next(i for i in range(len(text) - 1, 0, -1) if text[i].isdigit())
        path.write_text(text[:i] + str((int(text[i]) + 1) % 10) + text[i + 1 :])
    else:
        damage(path, how, random.Random(how))


def _quarantined(rec: recovery.Recovery) -> list[str]:
    assert rec.quarantine is not None
    return sorted(
        p.relative_to(rec.quarantine / QUERY).as_posix()
        for p in (rec.quarantine / QUERY).rglob("*")
        if p.is_file() and not p.name.endswith(".crc")
    )


def test_a_sound_checkpoint_has_no_problems_and_nothing_moves(copy):
    before = _tree(copy.ws.checkpoint_dir)
    assert verify(copy.qdir) == []
    rec = _recover(copy)
    assert rec.notes == [] and rec.rewind == {} and rec.quarantine is None
    assert _tree(copy.ws.checkpoint_dir) == before


@pytest.mark.parametrize("how", DAMAGE_PLUS)
def test_newest_commit_damaged_reruns_that_batch_from_the_previous_state(copy, how):
    c = QueryLayout(copy.qdir).last_committed()
    _damage(copy.qdir / "commits" / str(c), how)
    if how == "missing":  # the newest batch simply is not committed: Spark re-runs it itself
        assert verify(copy.qdir) == []
        assert _recover(copy).quarantine is None
        return
    problems = verify(copy.qdir)
    assert [p.path for p in problems] == [f"commits/{c}"], problems
    rec = _recover(copy)
    assert rec.rewind == {}  # batch c re-runs with its logged offsets: the sink skips it
    moved = _quarantined(rec)
    assert f"commits/{c}" in moved and not any(m.startswith("offsets/") for m in moved)
    assert all(int(m.rsplit("/", 1)[1].split(".")[0]) > c for m in moved if m.startswith("state"))
    assert QueryLayout(copy.qdir).last_committed() == c - 1
    assert verify(copy.qdir) == []
    assert f"batch {c} is re-run with its logged offsets" in rec.notes[0], rec.notes
    assert (rec.quarantine / "quarantine.json").exists()


@pytest.mark.parametrize("how", DAMAGE_PLUS)
def test_damaged_planned_batch_is_planned_again_and_the_sink_rewound(copy, how):
    c = QueryLayout(copy.qdir).last_committed()
    (copy.qdir / "commits" / str(c)).unlink()  # killed after planning batch c, before its commit
    (copy.qdir / "commits" / f".{c}.crc").unlink()
    _damage(copy.qdir / "offsets" / str(c), how)
    if how == "missing":
        assert verify(copy.qdir) == []
        return
    assert [p.path for p in verify(copy.qdir)] == [f"offsets/{c}"]
    rec = _recover(copy)
    assert rec.rewind == {QUERY: c - 1}
    assert f"offsets/{c}" in _quarantined(rec)
    assert QueryLayout(copy.qdir).last_planned() == c - 1 and verify(copy.qdir) == []


def test_a_start_that_stops_before_rewinding_leaves_the_rewind_to_the_next(copy):
    """Files moved, then a crash before the sinks were rewound: the next start, which finds a
    sound checkpoint, must still rewind them (else the sink skips re-planned batches)."""
    c = QueryLayout(copy.qdir).last_committed()
    _damage(copy.qdir / "offsets" / str(c), "garbage")
    assert _recover(copy).rewind == {QUERY: c - 1}
    again = _recover(copy)  # the crash: nobody called rewound()
    assert again.rewind == {QUERY: c - 1} and again.quarantine is None
    assert "still owe a rewind" in again.notes[0]
    again.rewound(QUERY)
    assert _recover(copy).rewind == {}
    assert not CheckpointLayout(copy.ws.checkpoint_dir).pending_rewind.exists()


@pytest.mark.parametrize("how", DAMAGE_PLUS)
def test_damaged_offsets_of_the_newest_commit_fall_back_one_batch(copy, how):
    c = QueryLayout(copy.qdir).last_committed()
    _damage(copy.qdir / "offsets" / str(c), how)
    assert [p.path for p in verify(copy.qdir)] == [f"offsets/{c}"]
    rec = _recover(copy)
    assert rec.rewind == {QUERY: c - 1}
    moved = _quarantined(rec)
    assert f"commits/{c}" in moved and (how == "missing" or f"offsets/{c}" in moved)
    assert QueryLayout(copy.qdir).last_committed() == c - 1 and verify(copy.qdir) == []


@pytest.mark.parametrize("how", DAMAGE_PLUS)
def test_damaged_older_offsets_a_restart_needs_are_refused_naming_the_savepoint(copy, how):
    c = QueryLayout(copy.qdir).last_committed()
    _damage(copy.qdir / "offsets" / str(c - 1), how)
    before = _tree(copy.ws.checkpoint_dir)
    with pytest.raises(recovery.CorruptCheckpointError) as err:
        _recover(copy)
    msg = str(err.value)
    assert f"offsets/{c - 1}" in msg
    assert f"--from-savepoint {copy.savepoint_id}" in msg and "examples/upi_per_minute.py" in msg
    assert err.value.savepoint == copy.savepoint_id
    assert _tree(copy.ws.checkpoint_dir) == before  # nothing moved


def _needed_changelogs(qdir: Path, partition: str) -> list[str]:
    c = QueryLayout(qdir).last_committed()
    return sorted(
        (
            f
            for f in QueryLayout(qdir).batch_files(c)
            if f.startswith(f"state/0/{partition}/") and f.endswith(".changelog")
        ),
        key=lambda f: int(f.rsplit("/", 1)[1].split(".")[0]),
    )


# (a changelog is binary: no "digit" case; "garbage" covers a same-size edit)
@pytest.mark.parametrize("how", DAMAGE)
def test_damaged_older_state_file_is_refused_naming_file_and_savepoint(copy, how):
    oldest = _needed_changelogs(copy.qdir, "0")[0]
    _damage(copy.qdir / oldest, how)
    assert oldest in [p.path for p in verify(copy.qdir)]
    before = _tree(copy.ws.checkpoint_dir)
    with pytest.raises(recovery.CorruptCheckpointError) as err:
        _recover(copy)
    assert oldest in str(err.value) and copy.savepoint_id in str(err.value)
    assert _tree(copy.ws.checkpoint_dir) == before


@pytest.mark.parametrize("how", ["truncate", "garbage", "empty", "missing"])
def test_damaged_newest_state_version_falls_back_one_batch(copy, how):
    newest = _needed_changelogs(copy.qdir, "1")[-1]
    c = QueryLayout(copy.qdir).last_committed()
    assert newest.endswith(f"/{c + 1}.changelog")
    _damage(copy.qdir / newest, how)
    assert newest in [p.path for p in verify(copy.qdir)]
    rec = _recover(copy)
    assert rec.rewind == {}  # batch c re-runs with its logged offsets and writes the state again
    moved = _quarantined(rec)
    assert f"commits/{c}" in moved and (how == "missing" or newest in moved)
    assert QueryLayout(copy.qdir).last_committed() == c - 1 and verify(copy.qdir) == []


def test_refusal_without_savepoint_or_mirror_says_how_to_start_over(copy):
    shutil.rmtree(copy.savepoint_root)
    _damage(copy.qdir / _needed_changelogs(copy.qdir, "0")[0], "garbage")
    with pytest.raises(recovery.CorruptCheckpointError) as err:
        _recover(copy)
    assert err.value.savepoint is None and "to start over, move" in str(err.value)
    with pytest.raises(recovery.CorruptCheckpointError) as err:
        recovery.recover(
            copy.ws.checkpoint_dir, [QUERY], savepoint_dir=None, mirror="s3://bucket/ckpt/upi"
        )
    assert "--restore-from s3://bucket/ckpt/upi" in str(err.value)


@pytest.mark.parametrize("how", ["truncate", "garbage", "empty"])
def test_damaged_query_metadata_is_moved_aside(copy, how):
    _damage(copy.qdir / "metadata", how)
    assert [p.path for p in verify(copy.qdir)] == ["metadata"]
    rec = _recover(copy)
    assert _quarantined(rec) == ["metadata"] and rec.rewind == {}
    assert verify(copy.qdir) == []


# -- end to end: Spark restarts on the damaged checkpoint ------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        "newest commit truncated",
        "committed offsets garbage",
        "newest changelog empty",
        "older changelog truncated",
    ],
)
def test_restart_on_a_damaged_checkpoint_equals_oracle(copy, case):
    q = copy.qdir
    c = QueryLayout(q).last_committed()
    target = {
        "newest commit truncated": (q / "commits" / str(c), "truncate"),
        "committed offsets garbage": (q / "offsets" / str(c), "garbage"),
        "newest changelog empty": (q / _needed_changelogs(q, "1")[-1], "empty"),
        "older changelog truncated": (q / _needed_changelogs(q, "0")[0], "truncate"),
    }
    path, how = target[case]
    _damage(path, how)
    append_lines(copy.ws.log_dir, MORE)
    if case == "older changelog truncated":
        with pytest.raises(recovery.CorruptCheckpointError) as err:
            _run(copy.ws, copy.savepoint_root)
        assert copy.savepoint_id in str(err.value)
        return
    code, out = _run(copy.ws, copy.savepoint_root)
    assert code == 0, out
    assert "is damaged" in out and "moved" in out, out
    assert compare(duckdb_counts(copy.ws.database), oracle(FIRST + MORE)).exact
    reader = EventLog(copy.ws.log_dir).reader("upi-payments-dlq")
    dead = sorted(r.value for p, e in reader.end_offsets().items() for r in reader.read(p, 0, e))
    bad = sorted(
        line
        for line in FIRST + MORE
        if line.startswith(b"{not") or b'"ten"' in line or b'"amount_paise"' not in line
    )
    assert dead == bad  # each dead letter once, across the fallback
