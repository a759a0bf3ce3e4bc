"""Savepoint rules without Spark: retention, compatibility, commit point, incomplete cleanup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest

from stateful_runtime.checkpoints import manifest, restore, retention, savepoints
from stateful_runtime.checkpoints.storage import LocalStore, open_store
from stateful_runtime.exceptions import AlreadyExistsError

DAY = 86_400.0


def _write(store: LocalStore, sid: str, job: str, created: float) -> None:
    store.put_bytes(f"{sid}/q/offsets/0", b"v1")
    store.put_bytes(
        f"{sid}/{manifest.MANIFEST}",
        json.dumps(
            {
                "format_version": manifest.FORMAT_VERSION,
                "id": sid,
                "job": job,
                "created_at": "",
                "created_at_epoch": created,
                "queries": {},
                "files": [],
                "fingerprint": {},
            }
        ).encode(),
    )


def test_retention_keeps_newest_protected_and_within_limits(tmp_path, monkeypatch):
    monkeypatch.setenv("SRT_HOME", str(tmp_path / "home"))
    store = LocalStore(tmp_path / "sp")
    now = 100 * DAY
    for i, age_days in enumerate([10, 5, 3, 2, 1]):
        _write(store, f"sp{i}", "job-a", now - age_days * DAY)
    _write(store, "other", "job-b", now - 30 * DAY)

    policy = retention.Retention(max_count=2, protected={"sp0"})
    gone = policy.expired(savepoints.list_savepoints(store.url, "job-a"), now=now)
    assert sorted(s.id for s in gone) == ["sp1", "sp2"]  # sp0 protected, sp3+sp4 newest two

    by_age = retention.Retention(max_age=timedelta(days=4))
    assert sorted(
        s.id for s in by_age.expired(savepoints.list_savepoints(store.url, "job-a"), now=now)
    ) == ["sp0", "sp1"]

    # Everything too old: the newest one still stays.
    every = retention.Retention(max_age=timedelta(hours=1))
    expired = {s.id for s in every.expired(savepoints.list_savepoints(store.url, "job-a"), now=now)}
    assert expired == {"sp0", "sp1", "sp2", "sp3"}

    retention.apply_retention(store.url, "job-a", retention.Retention(max_count=1))
    assert [s.id for s in savepoints.list_savepoints(store.url)] == ["other", "sp4"]
    assert not (tmp_path / "sp" / "sp0").exists()  # files gone, not only manifests


def test_compatibility_lists_every_difference():
    saved = {
        "job": "j",
        "queries": {
            "q": {
                "operators": {
                    "op": {
                        "kind": "process",
                        "keys": ["k"],
                        "states": {"a": "value<int>", "b": "map<str, int>"},
                    },
                    "win": {"kind": "native-window", "keys": ["k"], "states": {"window": "sum(x)"}},
                }
            }
        },
    }
    new = {
        "job": "j",
        "queries": {
            "q": {
                "operators": {
                    "op": {
                        "kind": "process",
                        "keys": ["k"],
                        "states": {"a": "value<str>", "c": "value<int>"},
                    },
                    "win": {
                        "kind": "native-window",
                        "keys": ["k2"],
                        "states": {"window": "sum(x)"},
                    },
                }
            }
        },
    }
    bad, dropped = restore.compatibility(saved, new)
    assert bad == [
        "query q, operator op: state 'a' was value<int>, is now value<str>",
        "query q, operator win: keyed by ['k'], now by ['k2']",
    ]
    assert dropped == ["query q, operator op: state 'b' (map<str, int>) is no longer declared"]
    assert restore.compatibility(saved, saved) == ([], [])
    # A union's inputs: added, removed or reordered are refused by name; a fingerprint written
    # before sources were in it is not compared.
    union = {"job": "j", "queries": {"q": {"operators": {}, "sources": ["a", "b"]}}}
    for now in (["b", "a"], ["a"], ["a", "b", "c"]):
        changed = {"job": "j", "queries": {"q": {"operators": {}, "sources": now}}}
        (what,), _ = restore.compatibility(union, changed)
        assert what.startswith(f"query q: read sources a, b, now reads {', '.join(now)}")
        assert "a union's inputs cannot be added, removed or reordered" in what
    assert restore.compatibility(union, union) == ([], [])
    assert restore.compatibility({"job": "j", "queries": {"q": {"operators": {}}}}, union) == (
        [],
        [],
    )
    # The same key fields with another type: refused (a key is found by its values); a
    # fingerprint written before key types were recorded is compared by names.
    typed = {"kind": "process", "keys": ["k"], "key_types": ["bigint"], "states": {}}
    retyped = {**typed, "key_types": ["string"]}
    (what,), _ = restore.compatibility(_one_op(typed), _one_op(retyped))
    assert what.startswith("query q, operator op: keyed by ['k'] of types ['bigint'], now")
    untyped = {k: v for k, v in typed.items() if k != "key_types"}
    assert restore.compatibility(_one_op(untyped), _one_op(retyped)) == ([], [])
    other_job = restore.compatibility(saved, {**saved, "job": "x"})[0]
    assert other_job == ["the savepoint is of job 'j', this job is 'x'"]


def _one_op(op: dict) -> dict:
    return {"job": "j", "queries": {"q": {"operators": {"op": op}}}}


def test_a_window_that_now_runs_native_is_refused_with_what_to_do():
    """Sliding and session windows with built-in aggregates moved from the window operator to
    Spark's native aggregation: a savepoint of the old code is refused, and says why and how."""
    op = {"keys": ["k"], "states": {}}
    saved = {"job": "j", "queries": {"q": {"operators": {"w": {**op, "kind": "window"}}}}}
    new = {"job": "j", "queries": {"q": {"operators": {"w": {**op, "kind": "native-window"}}}}}
    (bad,), _ = restore.compatibility(saved, new)
    assert bad.startswith("query q, operator w: was a window operator, is now native-window")
    assert "let the old job's windows close, then start this code on a new checkpoint" in bad


def test_sums_widened_since_the_checkpoint_are_named_with_the_ways_on():
    """A native window's state from before integral sums were widened to decimal(38,0) holds
    bigint sums Spark cannot convert: the check names the change and both ways on, from the
    planner's own signatures of the UPI job."""
    from examples.upi_per_minute import DEFAULTS, build
    from stateful_runtime.aggregates import Count, Sum
    from stateful_runtime.checkpoints.manifest import fingerprint
    from stateful_runtime.planner import chain, plan
    from stateful_runtime.streams import WindowNode

    def fp(wide: bool) -> dict:
        job = build(dict(DEFAULTS))
        (window,) = [n for n in chain(job.sinks[0]) if isinstance(n, WindowNode)]
        window.contents.update({"payments": Count(), "amount_paise": Sum("amount_paise", wide)})
        return fingerprint(job.name, plan(job).queries)

    old, new = fp(False), fp(True)
    (bad,), _ = restore.compatibility(old, new)
    assert "sum(amount_paise) in decimal(38,0)" in bad and restore.WIDENED_SUMS in bad
    assert "Sum(field, wide=False)" in bad and "new checkpoint.dir" in bad
    assert [q for q, _ in restore.widened_sums(old, new)] == ["upi-counts"]
    assert restore.widened_sums(new, new) == restore.widened_sums(old, old) == []
    assert restore.compatibility(old, old) == restore.compatibility(new, new) == ([], [])
    (sig,) = old["queries"]["upi-counts"]["operators"]["per-merchant-minute"]["states"].values()
    assert sig.endswith("amount_paise=sum(amount_paise)")  # the old signature: no type named
    assert not restore.widened(sig, sig.replace("sum(", "max("))  # another change is not one


def test_manifest_is_create_only(tmp_path):
    store = open_store(tmp_path)
    store.put_bytes("a/_manifest.json", b"1", create_only=True)
    with pytest.raises(AlreadyExistsError):
        store.put_bytes("a/_manifest.json", b"2", create_only=True)
    assert store.get_bytes("a/_manifest.json") == b"1"


def test_incomplete_savepoint_of_a_dead_writer_is_removed(tmp_path):
    store = LocalStore(tmp_path)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(dead.stdout)
    store.put_bytes(
        f"half/{savepoints.WRITER}",
        json.dumps(
            {"mark": savepoints.WRITER_MARK, "pid": pid, "host": os.uname().nodename}
        ).encode(),
    )
    store.put_bytes("half/q/offsets/0", b"v1")
    store.put_bytes(
        f"live/{savepoints.WRITER}",
        json.dumps(
            {"mark": savepoints.WRITER_MARK, "pid": os.getpid(), "host": os.uname().nodename}
        ).encode(),
    )
    assert savepoints.list_savepoints(tmp_path) == []
    assert savepoints.cleanup_incomplete(store) == ["half"]
    assert sorted(store.children()) == ["live"]  # still being written by a live process


def test_s3_store_multipart_upload_and_conditional_manifest(s3, tmp_path):
    big = tmp_path / "big.sst"
    big.write_bytes(os.urandom(9 * 1024 * 1024))  # above the 8 MiB multipart threshold
    store = open_store(f"s3://{s3.bucket}/unit")
    store.put_file(big, "sp/q/state/0/0/SSTs/big.sst")
    head = s3.client().head_object(Bucket=s3.bucket, Key="unit/sp/q/state/0/0/SSTs/big.sst")
    assert head["ETag"].strip('"').endswith("-2")  # two parts
    store.get_file("sp/q/state/0/0/SSTs/big.sst", tmp_path / "back.sst")
    assert (tmp_path / "back.sst").read_bytes() == big.read_bytes()
    store.put_bytes("sp/_manifest.json", b"{}", create_only=True)
    with pytest.raises(AlreadyExistsError):
        store.put_bytes("sp/_manifest.json", b"{}", create_only=True)
    store.delete([o.key for o in store.list("sp/")])
    assert list(store.list()) == []
