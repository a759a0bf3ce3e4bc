"""The checkpoint layout and the one reader of Spark's offset and commit logs, on a checkpoint
written file by file in Spark's formats (no Spark): batches 0 and 1 committed, batch 2 planned,
one stateful operator with two state partitions (and a third a rescale left behind)."""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stateful_runtime.checkpoints.layout import (
    CheckpointLayout,
    QueryLayout,
    claim,
    crc_sidecar,
    state_version,
)
from stateful_runtime.checkpoints.verify import verify
from stateful_runtime.connectors.alignment import late_watermark_ms
from stateful_runtime.exceptions import (
    CheckpointOwnershipError,
    ConfigError,
    JobLockedError,
    UnsafeCheckpointDirError,
)

WATERMARKS = {0: 0, 1: 1_000, 2: 2_500}
OFFSETS = {0: {"0": 5, "1": 7}, 1: {"0": 10, "1": 12}, 2: {"0": 15, "1": 20}}
# lz4-java's end block alone: a changelog holding no records, whole.
EMPTY_CHANGELOG = b"LZ4Block" + bytes([0x10]) + struct.pack("<ii", 0, 0) + bytes(4)


def _offsets_entry(batch: int, partitions: int = 2) -> str:
    meta = {
        "batchWatermarkMs": WATERMARKS[batch],
        "batchTimestampMs": 1_767_225_600_000 + batch,
        "conf": {"spark.sql.shuffle.partitions": str(partitions)},
    }
    return "\n".join(["v1", json.dumps(meta), json.dumps(OFFSETS[batch])])


@pytest.fixture
def ckpt(tmp_path: Path) -> CheckpointLayout:
    root = CheckpointLayout(tmp_path / "ckpt")
    q = root.query("counts")
    for d in (q.offset_log, q.commit_log):
        d.mkdir(parents=True)
    q.metadata.write_text(json.dumps({"id": "5f1c0d9e"}))
    for b in (0, 1, 2):
        q.offsets(b).write_text(_offsets_entry(b))
    for b in (0, 1):
        q.commit(b).write_text("v1\n" + json.dumps({"nextBatchWatermarkMs": WATERMARKS[b + 1]}))
    op = q.state / "0"
    (op / "_metadata" / "v2").mkdir(parents=True)
    (op / "_metadata" / "v2" / "0").write_text("v2\n{}")
    for part in ("0", "1", "2"):
        (op / part).mkdir()
        for version in (1, 2, 3):
            (op / part / f"{version}.changelog").write_bytes(EMPTY_CHANGELOG)
    # Hadoop's checksum file: "crc\0", bytes per checksum, one CRC-32 per chunk.
    crc = b"crc\0" + struct.pack(">iI", 512, zlib.crc32(EMPTY_CHANGELOG))
    crc_sidecar(op / "0" / "1.changelog").write_bytes(crc)
    return root


def test_a_checkpoint_directory_names_each_of_its_parts(tmp_path):
    root = CheckpointLayout(str(tmp_path))
    assert root == CheckpointLayout(tmp_path) and root.root == tmp_path
    assert root.marker == tmp_path / "_job.json"
    assert root.pending_rewind == tmp_path / "_rewind.json"
    assert root.quarantine == tmp_path / "_quarantine"
    assert root.dead_letters("payments") == tmp_path / "_dead_letters" / "payments"
    q = root.query("counts")
    assert q == QueryLayout(tmp_path / "counts") and q.root == tmp_path / "counts"
    assert (q.offsets(7), q.commit(7)) == (q.root / "offsets" / "7", q.root / "commits" / "7")
    assert (q.metadata, q.state) == (q.root / "metadata", q.root / "state")
    assert q.relative(q.offsets(7)) == "offsets/7"
    assert crc_sidecar(q.commit(7)) == q.root / "commits" / ".7.crc"
    assert [state_version(Path(n)) for n in ("8.changelog", "8_ab12.zip", "8.crc", "x")] == [
        8,
        8,
        None,
        None,
    ]


def test_the_log_reader_on_committed_and_planned_batches(ckpt):
    q = ckpt.query("counts")
    assert q.planned_batches() == [0, 1, 2] and q.committed_batches() == [0, 1]
    assert (q.last_planned(), q.last_committed()) == (2, 1)
    assert q.last_commit_time() == os.stat(q.commit(1)).st_mtime
    assert q.committed_offsets() == {"batch": 1, "watermark_ms": 1_000, "sources": [OFFSETS[1]]}
    assert q.committed_offsets(0) == {"batch": 0, "watermark_ms": 0, "sources": [OFFSETS[0]]}
    assert [q.watermark_ms(b) for b in (0, 1, 2)] == [0, 1_000, 2_500]
    assert q.state_partitions(1) == 2


def test_the_log_reader_before_any_batch_and_without_state(tmp_path):
    q = QueryLayout(tmp_path / "nothing-yet")
    assert q.planned_batches() == [] and q.committed_batches() == []
    assert (q.last_planned(), q.last_committed(), q.last_commit_time()) == (None, None, None)
    assert q.committed_offsets() is None
    assert q.state_partitions(0) is None  # stateless: no state directory


def test_the_late_event_watermark_is_the_batch_befores(ckpt):
    """Connectors read the same log: the batch being planned (2) drops records late by batch
    1's watermark, as Spark's stateful operators do."""
    q = ckpt.query("counts")
    assert late_watermark_ms(q.root) == 1_000
    q.offsets(2).unlink()
    assert late_watermark_ms(q.root) == 0  # batch 1 is planned: its predecessor's is 0
    assert late_watermark_ms(ckpt.query("elsewhere").root) == 0


def test_the_files_a_restart_at_a_batch_reads(ckpt):
    q = ckpt.query("counts")
    state = ["state/0/_metadata/v2/0"] + [
        f"state/0/{p}/{v}.changelog" for p in "01" for v in (1, 2)
    ]
    logs = ["metadata", "offsets/0", "commits/0", "offsets/1", "commits/1"]
    assert q.batch_files(1) == [*logs, "offsets/2", *state]
    assert q.batch_files(1, pending=False) == [*logs, *state]  # not the batch planned after it
    assert q.operators() == [q.state / "0"]
    assert q.partitions(q.state / "0", 2) == [q.state / "0" / "0", q.state / "0" / "1"]
    # Each input's watermarks: the newest file at or before the batch (a batch after it, or
    # one planned and not committed, may have written its own).
    q.input_watermarks.mkdir()
    for b in (0, 2):
        (q.input_watermarks / str(b)).write_text("{}")
    assert q.batch_files(1, pending=False) == [*logs, "input-watermarks/0", *state]
    assert q.input_watermarks_upto(2) == q.input_watermarks / "2"
    assert ckpt.query("elsewhere").input_watermarks_upto(5) is None


def test_state_files_after_a_version_carry_their_checksum_files(ckpt):
    q = ckpt.query("counts")
    after = sorted(q.relative(p) for p in q.state_files_after(2))
    assert after == [f"state/0/{p}/3.changelog" for p in "012"]
    assert sorted(q.relative(p) for p in q.state_files_after(0))[0] == "state/0/0/.1.changelog.crc"


def test_verify_names_a_damaged_file_by_its_place_in_the_layout(ckpt):
    q = ckpt.query("counts")
    assert verify(q.root) == []
    q.commit(1).write_text("")
    q.state.joinpath("0", "1", "2.changelog").write_bytes(EMPTY_CHANGELOG[:-3])
    assert [(p.path, p.kind, p.batch) for p in verify(q.root)] == [
        ("commits/1", "commits", 1),
        ("state/0/1/2.changelog", "state", 2),
    ]


def test_checkpoint_dir_is_bound_to_its_job(tmp_path):
    claim(tmp_path, "job-a", ["q"])
    claim(tmp_path, "job-a", ["q"])  # the same job may come back
    with pytest.raises(CheckpointOwnershipError, match="belongs to job 'job-a'"):
        claim(tmp_path, "job-b", ["q"])


# -- ownership: what the runtime may claim, move aside or delete ------------------------------


@pytest.mark.parametrize("where", ["cwd", "home", "root", "parent of cwd"])
def test_a_checkpoint_dir_that_is_the_working_or_a_home_directory_is_refused(
    tmp_path, monkeypatch, where
):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    directory = {"cwd": ".", "home": str(tmp_path / "home"), "root": "/"}.get(where, "..")
    with pytest.raises(UnsafeCheckpointDirError, match="nothing was moved") as exc:
        claim(directory, "j", ["q"])
    assert "checkpoint.dir" in str(exc.value)
    assert not (work / "_job.json").exists() and not (tmp_path / "home" / "_job.json").exists()
    assert not (work / "_lock").exists()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ours=st.sets(st.sampled_from(["_job.json", "_lock", "_rewind.json", "_quarantine", "q"])),
    others=st.sets(
        st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=8).filter(
            lambda n: n not in {"_job.json", "_lock", "_rewind.json", "q"}
        ),
        max_size=3,
    ),
)
def test_a_checkpoint_dir_holding_anything_the_runtime_did_not_create_is_refused(
    tmp_path_factory, ours, others
):
    root = tmp_path_factory.mktemp("ck")
    layout = CheckpointLayout(root)
    if "_job.json" in ours:
        layout.marker.write_text(json.dumps({"format_version": 1, "job": "j", "queries": ["q"]}))
    for name in ours - {"_job.json"}:
        if name == "q":  # a query's checkpoint, as Spark starts it
            (root / "q" / "offsets").mkdir(parents=True)
        elif name == "_quarantine":
            (root / name).mkdir()
        else:
            (root / name).write_text("")
    for name in others:
        (root / name).write_text("not the runtime's")
    before = sorted(p.name for p in root.iterdir())
    if others:
        with pytest.raises(UnsafeCheckpointDirError, match="did not create"):
            layout.check_owned()
        with pytest.raises(UnsafeCheckpointDirError):
            claim(root, "j", ["q"])
        assert sorted(p.name for p in root.iterdir()) == before  # nothing written
    else:
        layout.check_owned()
        if "q" in ours and "_job.json" not in ours:
            # an unmarked directory with a query's directory is not adopted, nor moved aside
            with pytest.raises(UnsafeCheckpointDirError, match="no _job.json"):
                layout.check_owned(moving=True)


def test_a_spark_checkpoint_without_a_marker_is_not_adopted(ckpt):
    with pytest.raises(ConfigError, match="no _job.json"):
        claim(ckpt.root, "j", ["counts"])
    with pytest.raises(UnsafeCheckpointDirError, match="not a job checkpoint"):
        ckpt.check_owned(moving=True)


def test_one_process_holds_a_checkpoint_and_is_named_to_the_next(tmp_path):
    layout = CheckpointLayout(tmp_path / "ck")
    first = layout.lock("j", {"pid": 4242, "run_id": "r1", "since": "2026-11-25T20:00:00Z"})
    with pytest.raises(JobLockedError, match="pid 4242, run_id r1, since 2026") as exc:
        layout.lock("j", {"pid": 1, "run_id": "r2", "since": "now"})
    assert exc.value.holder["pid"] == 4242 and "srt stop j" in str(exc.value)
    assert json.loads(layout.lock_file.read_text())["run_id"] == "r1"  # not overwritten
    first.release()
    layout.lock("j", {"pid": 1, "run_id": "r2", "since": "now"}).release(tidy=True)
    assert layout.lock_file.exists()  # not made by this lock: left
    fresh = CheckpointLayout(tmp_path / "new")
    fresh.lock("j", {"pid": 1}).release(tidy=True)
    assert not fresh.root.exists()  # a start that failed leaves no directory it made


def test_the_lock_follows_the_directory_a_restore_puts_in_place(tmp_path):
    layout = CheckpointLayout(tmp_path / "ck")
    lock = layout.lock("j", {"pid": 1, "run_id": "r1", "since": "t"})
    staging = tmp_path / "staging"
    staging.mkdir()
    lock.follow(staging)
    os.replace(layout.root, tmp_path / "aside")
    os.replace(staging, layout.root)
    lock.settle()
    with pytest.raises(JobLockedError, match="run_id r1"):
        layout.lock("j", {"pid": 2, "run_id": "r2", "since": "t"})
    CheckpointLayout(tmp_path / "aside").lock("j", {"pid": 3}).release()  # the old one is free
    lock.release()


FINGERPRINT = {"job": "j", "queries": {"counts": {"operators": {}}}}


def _savepoint(ckpt: CheckpointLayout, tmp_path: Path):
    from stateful_runtime.checkpoints import savepoints

    ckpt.marker.write_text(
        json.dumps(
            {"format_version": 1, "job": "j", "queries": ["counts"], "fingerprint": FINGERPRINT}
        )
    )
    return savepoints.create(ckpt.root, tmp_path / "savepoints")


@pytest.mark.parametrize("what", ["an unrelated file", "no marker", "the working directory"])
def test_a_restore_moves_aside_only_a_checkpoint_of_the_runtime(ckpt, tmp_path, monkeypatch, what):
    from stateful_runtime.checkpoints import restore

    sp = _savepoint(ckpt, tmp_path)
    target = tmp_path / "work"
    target.mkdir()
    (target / "events.log").write_text("someone's data")
    if what == "no marker":
        target = tmp_path / "unmarked"
        (target / "counts" / "offsets").mkdir(parents=True)
    elif what == "the working directory":
        (target / "events.log").unlink()
        monkeypatch.chdir(target)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(UnsafeCheckpointDirError, match="nothing was moved"):
        restore.restore(sp, "." if what == "the working directory" else target, FINGERPRINT)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_a_restore_over_a_checkpoint_moves_it_aside_and_keeps_the_lock(ckpt, tmp_path):
    from stateful_runtime.checkpoints import restore

    sp = _savepoint(ckpt, tmp_path)
    lock = ckpt.lock("j", {"pid": 7, "run_id": "r7", "since": "t"})
    done = restore.restore(sp, ckpt.root, FINGERPRINT, lock=lock)
    aside = Path(done["previous_checkpoint_moved_to"])
    assert (aside / "_job.json").exists() and ckpt.query("counts").last_committed() == 1
    with pytest.raises(JobLockedError, match="run_id r7"):
        ckpt.lock("j", {"pid": 8})
    lock.release()
