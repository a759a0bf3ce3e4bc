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

from stateful_runtime.checkpoints.layout import (
    CheckpointLayout,
    QueryLayout,
    claim,
    crc_sidecar,
    event_time_stats,
    state_version,
)
from stateful_runtime.checkpoints.verify import verify
from stateful_runtime.connectors.alignment import late_watermark_ms
from stateful_runtime.exceptions import CheckpointOwnershipError

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
    assert event_time_stats(f"{root.dead_letters('payments')}/") == (
        tmp_path / "_dead_letters" / "payments.event-time"
    )
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
