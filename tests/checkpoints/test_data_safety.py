"""The runtime deletes only what it can prove it created, and never reads or writes outside the
root a manifest, mirror or id points into (issue: savepoint cleanup deleted other data)."""

from __future__ import annotations

import json
import os

import pytest

from stateful_runtime.checkpoints import layout, manifest, restore, retention, savepoints
from stateful_runtime.checkpoints.storage import LocalStore
from stateful_runtime.exceptions import ConfigError, SavepointError
from stateful_runtime.names import InvalidNameError, Name, PathEscapeError, contained

DAY = 86_400.0


def _manifest(sid: str, job: str, created: float, files: list | None = None) -> bytes:
    return json.dumps(
        {
            "format_version": manifest.FORMAT_VERSION,
            "id": sid,
            "job": job,
            "created_at": "",
            "created_at_epoch": created,
            "queries": {"q": {"batch": 0}},
            "files": files or [],
            "fingerprint": {},
        }
    ).encode()


def _foreign_tree(root):
    """What a user may keep next to savepoints: an event log, a checkpoint, loose files."""
    (root / "log" / "payments" / "store").mkdir(parents=True)
    (root / "log" / "payments" / "topic.json").write_text("{}")
    (root / "ckpt" / "q" / "offsets").mkdir(parents=True)
    (root / "ckpt" / "q" / "offsets" / "0").write_text("v1")
    (root / "notes.txt").write_text("mine")
    (root / "empty-dir").mkdir()
    # A directory holding a file named like our writer record, but not written by us.
    (root / "lookalike").mkdir()
    (root / "lookalike" / savepoints.WRITER).write_text('{"pid": 1, "host": "x"}')
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_prune_and_cleanup_leave_what_they_did_not_create(tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    before = _foreign_tree(root)
    store = LocalStore(root)
    for i in range(3):
        store.put_bytes(f"sp{i}/q/offsets/0", b"v1")
        store.put_bytes(f"sp{i}/{manifest.MANIFEST}", _manifest(f"sp{i}", "job-a", 1000.0 + i))
    gone = retention.apply_retention(root, "job-a", retention.Retention(max_count=1))
    assert sorted(sp.id for sp in gone) == ["sp0", "sp1"]
    assert savepoints.cleanup_incomplete(store) == []
    after = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    assert after == sorted(
        before + ["sp2", "sp2/q", "sp2/q/offsets", "sp2/q/offsets/0", f"sp2/{manifest.MANIFEST}"]
    )


@pytest.mark.parametrize(
    "ref", ["..", ".", "../x", "/", "a/..", "-rf", ".hidden", "a b", "x/../..", "é"]
)
def test_savepoint_ids_that_are_not_names_are_refused(tmp_path, ref):
    (tmp_path / "root").mkdir()
    with pytest.raises((InvalidNameError, SavepointError)):
        savepoints.resolve(ref, [tmp_path / "root"])
    with pytest.raises(InvalidNameError):
        savepoints.dispose_unreadable(tmp_path / "root", ref)


def test_dispose_unreadable_only_removes_our_savepoints(tmp_path):
    store = LocalStore(tmp_path)
    store.put_bytes(f"bad/{manifest.MANIFEST}", b'{"format_version": 1, "job"')  # truncated
    store.put_bytes("bad/q/offsets/0", b"v1")
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "data.bin").write_bytes(b"x")
    with pytest.raises(SavepointError, match="not a savepoint"):
        savepoints.dispose_unreadable(tmp_path, "theirs")
    assert (tmp_path / "theirs" / "data.bin").exists()
    savepoints.dispose_unreadable(tmp_path, "bad")
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize(
    "bad",
    [
        b"",  # empty
        b'{"format_version": 1, "job": "j"',  # truncated
        b"[1, 2]",  # not an object
        b'{"format_version": 99}',  # a future format
        b"\xff\xfe",  # not text
    ],
)
def test_one_corrupt_manifest_breaks_neither_list_nor_prune(tmp_path, bad):
    store = LocalStore(tmp_path)
    for i in range(3):
        store.put_bytes(f"ok{i}/{manifest.MANIFEST}", _manifest(f"ok{i}", "job", 100.0 + i))
    store.put_bytes(f"broken/{manifest.MANIFEST}", bad)
    problems: list = []
    listed = savepoints.list_savepoints(tmp_path, "job", problems)
    assert [sp.id for sp in listed] == ["ok0", "ok1", "ok2"]
    assert len(problems) == 1 and "broken" in str(problems[0])
    assert "dispose --force" in str(problems[0])
    gone = retention.apply_retention(tmp_path, "job", retention.Retention(max_count=1))
    assert sorted(sp.id for sp in gone) == ["ok0", "ok1"]
    assert (tmp_path / "broken" / manifest.MANIFEST).exists()  # unreadable, so not touched
    with pytest.raises(manifest.CorruptManifestError, match="broken"):
        savepoints.resolve("broken", [tmp_path])


@pytest.mark.parametrize(
    "path", ["../escaped", "q/../../escaped", "/etc/passwd", "q//x", "q/./x", "other/x"]
)
def test_manifest_paths_outside_the_savepoint_are_refused(tmp_path, path):
    store = LocalStore(tmp_path / "sp")
    store.put_bytes("evil/q/offsets/0", b"v1")
    entry = {"path": path, "size": 2, "sha256": "0" * 64}
    store.put_bytes(f"evil/{manifest.MANIFEST}", _manifest("evil", "job", 1.0, [entry]))
    with pytest.raises(manifest.CorruptManifestError):
        savepoints.resolve("evil", [tmp_path / "sp"])
    # Even a manifest that slipped past parsing cannot make restore write outside its target.
    sp = manifest.Savepoint(store, "evil", json.loads(_manifest("evil", "job", 1.0, [entry])))
    if path == "other/x":  # inside the checkpoint, only of no query: not copied
        restore.materialize(sp, tmp_path / "restored")
        assert not (tmp_path / "restored" / "other").exists()
    else:
        with pytest.raises(PathEscapeError):
            restore.materialize(sp, tmp_path / "restored")
        assert not (tmp_path / "restored").exists()
    assert not (tmp_path / "escaped").exists()


def test_store_keys_cannot_leave_the_store(tmp_path):
    store = LocalStore(tmp_path / "root")
    for key in ("../x", "a/../../x", "/abs"):
        with pytest.raises(PathEscapeError):
            store.put_bytes(key, b"no")
    os.symlink(tmp_path, tmp_path / "root-link-target", target_is_directory=True)
    (tmp_path / "root").mkdir(exist_ok=True)
    os.symlink(tmp_path, tmp_path / "root" / "link")
    with pytest.raises(PathEscapeError):
        contained(tmp_path / "root", "link/x", where="test")


@pytest.mark.parametrize(
    "text",
    [
        "",
        '{"job": "j"',
        "[]",
        '{"job": "../x", "queries": []}',
        '{"job": "j", "queries": ["../../etc"]}',
    ],
)
def test_corrupt_checkpoint_marker_is_named_with_what_to_do(tmp_path, text):
    layout.CheckpointLayout(tmp_path).marker.write_text(text)
    with pytest.raises(ConfigError, match=r"_job\.json is corrupt.*--from-savepoint"):
        layout.owner(tmp_path)
    with pytest.raises(ConfigError, match="corrupt"):
        layout.claim(tmp_path, "j", ["q"])


def test_names_are_one_type_everywhere():
    assert Name("upi-counts", "sink") == "upi-counts"
    for bad in ("", ".", "..", "a/b", "a\\b", "-x", ".x", "x" * 201, None, 3, "naïve"):
        with pytest.raises(InvalidNameError):
            Name(bad, "job")
    from stateful_runtime import CheckpointConfig, StreamJob
    from stateful_runtime.connectors.eventlog import EventLog

    with pytest.raises(InvalidNameError):
        StreamJob("../x", CheckpointConfig("/tmp/x"))
    with pytest.raises(InvalidNameError):
        EventLog("/tmp/log").topic("..")


def test_a_names_pickle_round_trip_keeps_it_a_name():
    import pickle

    n = pickle.loads(pickle.dumps(Name("job-1", "job")))
    assert isinstance(n, Name) and n == "job-1"


def test_savepoint_writer_refuses_an_existing_id(tmp_path):
    """Two writers with the same id must not interleave files in one directory."""
    ckpt = tmp_path / "ckpt"
    layout.claim(ckpt, "job", ["q"])
    (ckpt / "q" / "commits").mkdir(parents=True)
    (tmp_path / "sp" / "taken").mkdir(parents=True)
    (tmp_path / "sp" / "taken" / "f").write_text("someone else's")
    with pytest.raises(SavepointError, match="already exists"):
        savepoints.create(ckpt, tmp_path / "sp", savepoint_id="taken")
    assert (tmp_path / "sp" / "taken" / "f").read_text() == "someone else's"
