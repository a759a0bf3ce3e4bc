"""A checkpoint on S3 as a path (``checkpoint.dir=s3://...``): what the runtime's checkpoint code
asks of a directory, answered by a real S3 API endpoint, and the job's lock as a lease.

The job on S3 end to end, killed and resumed on the cluster: tests/faults/test_cluster_kills.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from stateful_runtime.checkpoints import keyed
from stateful_runtime.checkpoints.layout import CheckpointLayout, LeaseLock, claim, owner
from stateful_runtime.checkpoints.storage import (
    S3Path,
    checkpoint_path,
    fill_file,
    read_arrow,
    remove_tree,
    s3a_url,
    write_file,
)
from stateful_runtime.exceptions import (
    AlreadyExistsError,
    ConfigError,
    JobLockedError,
    StorageError,
)
from tests.helpers import S3Endpoint


@pytest.fixture
def root(s3: S3Endpoint) -> S3Path:
    path = checkpoint_path(f"s3://{s3.bucket}/paths-{uuid.uuid4().hex[:8]}/job")
    assert isinstance(path, S3Path)
    return path


def test_names_are_those_of_the_url(root: S3Path):
    assert str(root).startswith("s3://srt-test/paths-") and root.name == "job"
    assert str(root / "q" / "offsets") == f"{root}/q/offsets"
    assert isinstance(root / "q", S3Path) and isinstance(root.parent, S3Path)
    assert str(root.parent) == str(root).rsplit("/", 1)[0]
    assert (root / "q" / "commits" / "3").relative_to(root).as_posix() == "q/commits/3"
    assert s3a_url(root / "q") == "s3a://" + f"{root}/q".removeprefix("s3://")
    assert checkpoint_path(str(root)) == root and checkpoint_path(root) is root
    for wrong in ("gs://bucket/prefix", "s3://bucket", "s3://"):
        with pytest.raises(ConfigError, match="s3://bucket/prefix"):
            checkpoint_path(wrong)


def test_files_and_directories(root: S3Path, s3: S3Endpoint):
    q = root / "q"
    assert not root.exists() and not q.is_dir()
    write_file(q / "offsets" / "0", "v1\n{}")
    write_file(q / "offsets" / "1", b"v1\n{}\n")
    (q / "state" / "0" / "1" / "2.changelog").write_bytes(b"x")
    # A directory marker as S3A writes one (a key ending in "/") is not an entry of its own.
    s3.client().put_object(Bucket=s3.bucket, Key=f"{q.key}/state/0/1/", Body=b"")

    assert root.is_dir() and q.is_dir() and (q / "offsets" / "0").is_file()
    assert not (q / "offsets").is_file() and not (q / "nothing").exists()
    assert (q / "offsets" / "0").read_text() == "v1\n{}"
    assert (q / "offsets" / "1").stat().st_size == 6
    assert [p.name for p in (q / "offsets").iterdir()] == ["0", "1"]
    assert [p.name for p in q.iterdir()] == ["offsets", "state"]
    assert [p.relative_to(q).as_posix() for p in q.glob("state/*/*")] == ["state/0/1"]
    assert [p.name for p in q.rglob("*.changelog")] == ["2.changelog"]
    assert list((q / "nothing").iterdir()) == []  # made by mkdir, or missing: one on S3
    with pytest.raises(FileNotFoundError):
        (q / "nothing").read_bytes()

    with (q / "f").open("w") as f:
        f.write("text")
    (q / "f").replace(q / "g")
    assert not (q / "f").exists() and (q / "g").read_text() == "text"
    (q / "g").unlink()
    (q / "g").unlink(missing_ok=True)
    with pytest.raises(FileNotFoundError):
        (q / "g").unlink()

    # A directory moves object by object; S3A's markers of it and below it are dropped.
    s3.client().put_object(Bucket=s3.bucket, Key=f"{q.key}/state/", Body=b"")
    (q / "state").replace(q / "moved")
    assert [p.relative_to(q).as_posix() for p in q.rglob("*.changelog")] == [
        "moved/0/1/2.changelog"
    ]
    assert not (q / "state").exists()

    (q / "once").write_bytes(b"1", create_only=True)
    with pytest.raises(AlreadyExistsError):
        (q / "once").write_bytes(b"2", create_only=True)
    assert (q / "once").read_bytes() == b"1"

    # What needs a local file refuses the path by name rather than writing to "s3:/...".
    with pytest.raises(StorageError, match="is on S3"):
        os.replace(q / "once", q / "twice")
    remove_tree(root)
    assert not root.exists() and s3.keys(root.key) == []


def test_keyed_state_files_round_trip(root: S3Path):
    """A partition's state file and its commit record, written and read back as the worker and
    the driver do."""
    import pyarrow as pa

    part = root / "q" / keyed.KEYED_DIR / "op" / "0"
    rows = pa.record_batch(
        [pa.array([b"k1", b"k2"]), pa.array([b"v1", None])], schema=keyed.schema()
    )
    written = keyed.write(part, 1, keyed.DELTA, "tok1", [rows])
    keyed.record(part.parent, 1, {0: "tok1"})
    assert keyed.committed(part, 1, keyed.DELTA) == written
    assert keyed.committed_token(part, 1) == "tok1"
    assert keyed.token(written) == "tok1" and keyed.problem(written) is None
    assert list(keyed.rows(written)) == [([b"k1", b"k2"], [b"v1", None])]
    assert keyed.needs(part, 1) == ([written], [])

    # An Arrow file put by a local writer, read back whole.
    def fill(tmp):
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, rows.schema) as w:
            w.write_batch(rows)

    fill_file(root / "x.arrow", fill)
    with read_arrow(root / "x.arrow") as source:
        assert pa.ipc.open_file(source).read_all().num_rows == 2


def test_claim_and_marker_on_s3(root: S3Path):
    claim(str(root), "job-a", ["q"])
    assert owner(root)["job"] == "job-a"
    assert CheckpointLayout(str(root)).foreign() == []
    (root / "stranger.txt").write_text("not ours")
    assert CheckpointLayout(root).foreign() == ["stranger.txt"]


def test_the_lock_is_a_lease(root: S3Path, monkeypatch):
    layout = CheckpointLayout(root)
    held = layout.lock("job-a", {"pid": os.getpid(), "run_id": "r1"})
    assert isinstance(held, LeaseLock)
    # A live holder keeps it: the refusal names it.
    with pytest.raises(JobLockedError, match=f"pid {os.getpid()}"):
        layout.lock("job-a", {"pid": os.getpid() + 1, "run_id": "r2"})
    held.release()
    assert not layout.lock_file.exists()

    # A holder of this machine whose process is gone (kill -9) gives it up at once.
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    stale = {"pid": int(dead.stdout), "run_id": "r0", "host": __import__("socket").gethostname()}
    layout.lock_file.write_text(json.dumps(stale))
    taken = layout.lock("job-a", {"pid": os.getpid(), "run_id": "r3"})
    assert json.loads(layout.lock_file.read_text())["run_id"] == "r3"

    # One of another machine only once its lease lapsed without renewal.
    taken.release()
    layout.lock_file.write_text(json.dumps({"pid": 1, "run_id": "r4", "host": "elsewhere"}))
    with pytest.raises(JobLockedError):
        layout.lock("job-a", {"pid": os.getpid(), "run_id": "r5"})
    monkeypatch.setattr(LeaseLock, "LEASE_S", -1.0)
    again = layout.lock("job-a", {"pid": os.getpid(), "run_id": "r5"})
    again.renew()  # renewed over its own version
    assert json.loads(layout.lock_file.read_text())["run_id"] == "r5"
    # Taken over meanwhile (this process stalled past its lease): the renewal says so and the
    # job stops; the release leaves the new holder's lease alone.
    layout.lock_file.write_text(json.dumps({"pid": 1, "run_id": "r6", "host": "elsewhere"}))
    with pytest.raises(StorageError, match="another process took it over .*run_id r6"):
        again.renew()
    again.release()
    assert json.loads(layout.lock_file.read_text())["run_id"] == "r6"
