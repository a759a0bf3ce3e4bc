"""Savepoints, restore, rescale, upgrade and the S3 checkpoint mirror, on real Spark and S3.

The UPI job (native window path) and a keyed process function (state in the worker's RocksDB)
run in this process on the shared SparkSession; the running-job cases use the real `srt` CLI.
Every case ends with the sink table equal to an oracle computed from the events directly.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import duckdb
import pytest
from upi_events import events, oracle

from stateful_runtime.checkpoints import keyed, manifest, savepoints
from stateful_runtime.checkpoints.keyed import key_groups
from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.checkpoints.manifest import sha256_file
from stateful_runtime.checkpoints.mirror import latest as mirror_latest
from stateful_runtime.checkpoints.state_reader import checkpoint_of, inspect, needs_spark, summary
from stateful_runtime.exceptions import IncompatibleSavepointError
from stateful_runtime.runtime.control import check_state
from stateful_runtime.runtime.loader import load_job_file
from stateful_runtime.runtime.runner import JobRunner
from tests.helpers import EXAMPLES, append_lines, kill_group, srt, srt_background, wait_for

pytestmark = pytest.mark.slow

LINES = list(events(36_000, merchants=30, rate_per_s=200, disorder_ms=3_000, seed=5))
THIRDS = [LINES[:12_000], LINES[12_000:24_000], LINES[24_000:]]


def run_job(job_file: Path, overrides: dict, **runner_args) -> tuple[JobRunner, str]:
    jf = load_job_file(job_file, {k: str(v) for k, v in overrides.items()})
    out = io.StringIO()
    runner = JobRunner(jf, available_now=True, out=out, **runner_args)
    code = runner.run()
    assert code == 0, out.getvalue()
    return runner, out.getvalue()


def upi_sets(upi, ckpt: Path, sp_root: Path, **more) -> dict:
    return {
        "source.log_dir": upi.log_dir,
        "sink.database": upi.database,
        "checkpoint.dir": ckpt,
        "savepoint.dir": sp_root,
        "source.max_records_per_batch": 6_000,
        **more,
    }


def test_rescale_4_to_2_to_4_through_savepoints_equals_oracle(spark, upi, tmp_path):
    job = EXAMPLES / "upi_per_minute.py"
    roots = tmp_path / "savepoints"
    append_lines(upi.log_dir, THIRDS[0])
    run_job(job, upi_sets(upi, tmp_path / "ck4", roots, parallelism=4))
    sp1 = savepoints.create(tmp_path / "ck4", roots)
    assert sp1.manifest["queries"]["upi-counts"]["state_partitions"] == 4
    with checkpoint_of(sp1.id, [str(roots)]) as ck:  # window state: one row per open window
        rows = inspect(spark, ck, key="M001")
    assert rows and all(r["merchant_id"] == "M001" and r["state"] == "window" for r in rows)

    append_lines(upi.log_dir, THIRDS[1])
    runner, out = run_job(
        job, upi_sets(upi, tmp_path / "ck2", roots, parallelism=2), from_savepoint=sp1.id
    )
    assert "rescaling the state of upi-counts from 4 to 2 partitions" in out
    assert upi.table() == oracle(THIRDS[0] + THIRDS[1])
    qdir = tmp_path / "ck2" / "upi-counts"
    query = QueryLayout(qdir)
    assert query.state_partitions(query.last_committed()) == 2

    sp2 = savepoints.create(tmp_path / "ck2", roots)
    assert sp2.manifest["restored_from"] == sp1.location
    append_lines(upi.log_dir, THIRDS[2])
    run_job(
        job, upi_sets(upi, tmp_path / "ck4b", roots, parallelism=4), from_savepoint=sp2.location
    )
    assert upi.table() == oracle(LINES)
    ids = [sp.id for sp in savepoints.list_savepoints(roots, "upi-per-minute")]
    assert ids == [sp1.id, sp2.id]


COUNTER_JOB = """
from dbt_sink import DuckDBUpsertSink
from stateful_runtime import (KeyedProcessFunction, LogSource, StreamJob, ValueStateDescriptor,
                              WatermarkStrategy)
from datetime import timedelta

DEFAULTS = {{"source.log_dir": "", "sink.database": "", "checkpoint.dir": "",
             "checkpoint.interval_s": 0.2, "parallelism": 2}}
PAYMENT = {{"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int}}


class PaymentCounter(KeyedProcessFunction):
    output_schema = {output}

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("{state}", int))

    def process_element(self, event, ctx):
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        yield {emit}


def build(config):
    job = StreamJob.from_config("payment-counter", config)
    src = LogSource.from_config({{**config, "source.topic": "upi-payments",
                                 "source.max_records_per_batch": 4000}}, PAYMENT)
    (job.from_source(src, WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5))
                     .with_timestamp_field("ts_ms"), name="payments")
        .key_by("merchant_id").process(PaymentCounter(), name="counter")
        .sink_to(DuckDBUpsertSink(config["sink.database"], "payment_counts",
                                  key=("merchant_id",)), name="counts"))
    return job
"""


def counter_job(path: Path, *, upgraded: bool = False, state: str = "count") -> Path:
    if upgraded:  # v2: a new output column, the same state
        output = '{"merchant_id": str, "payments": int, "payments_x2": int}'
        emit = '{"merchant_id": ctx.get_current_key(), "payments": n, "payments_x2": 2 * n}'
    else:
        output = '{"merchant_id": str, "payments": int}'
        emit = '{"merchant_id": ctx.get_current_key(), "payments": n}'
    path.write_text(COUNTER_JOB.format(output=output, emit=emit, state=state))
    return path


def counts(db: Path, columns: str = "merchant_id, payments") -> dict:
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute(f"SELECT {columns} FROM payment_counts").fetchall()
        return {r[0]: r[1:] for r in rows}
    finally:
        con.close()


def counted(db: Path) -> int:
    """Payments counted so far (-1 while the running job holds the database)."""
    try:
        return sum(n for (n,) in counts(db).values())
    except (duckdb.IOException, duckdb.CatalogException):
        return -1


def expected_counts(lines) -> Counter:
    return Counter(json.loads(line)["merchant_id"] for line in lines)


def test_savepoint_while_running_then_stop_with_savepoint_upgrade_and_restore(
    spark, upi, tmp_path, srt_env
):
    """Savepoint of a running job (it keeps running), stop-with-savepoint, new code with a new
    output column restored from it: counts are exact (exactly once across the upgrade); an
    older savepoint restored into a fresh directory also ends exact (the sink forgets the
    batches after it and they run again)."""
    # Thirds of 4,500 events: each two batches of the job's 4,000-record cap (the savepoint
    # of the running job comes after its second); the counts are per record, in Python.
    thirds = [LINES[:4_500], LINES[4_500:9_000], LINES[9_000:13_500]]
    v1 = counter_job(tmp_path / "counter_v1.py")
    v2 = counter_job(tmp_path / "counter_v2.py", upgraded=True)
    db, roots = tmp_path / "counts.duckdb", tmp_path / "savepoints"
    sets = [
        "--set",
        f"source.log_dir={upi.log_dir}",
        "--set",
        f"sink.database={db}",
        "--set",
        f"checkpoint.dir={tmp_path / 'ck'}",
        "--set",
        f"savepoint.dir={roots}",
    ]
    append_lines(upi.log_dir, thirds[0])
    log = tmp_path / "v1.log"
    proc = srt_background(["run", str(v1), *sets], srt_env, log)
    qdir = tmp_path / "ck" / "counter"
    try:
        wait_for(lambda: (QueryLayout(qdir).last_committed() or -1) >= 1, proc, log, "two batches")
        taken = srt(["savepoint", "create", "payment-counter", "--json"], srt_env)
        assert taken.returncode == 0, taken.stderr
        early = json.loads(taken.stdout)
        assert proc.poll() is None  # the job kept running
        append_lines(upi.log_dir, thirds[1])
        total = len(thirds[0]) + len(thirds[1])
        wait_for(lambda: counted(db) == total, proc, log, "all events counted")
        stopped = srt(["savepoint", "create", "payment-counter", "--stop", "--json"], srt_env)
        assert stopped.returncode == 0, stopped.stderr + log.read_text()[-3000:]
        final = json.loads(stopped.stdout)
        assert final["kind"] == "stop-with-savepoint"
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            kill_group(proc)
    listed = srt(["savepoint", "list", "payment-counter", "--json"], srt_env)
    assert [r["id"] for r in json.loads(listed.stdout)] == [early["id"], final["id"]]
    assert early["batches"]["counter"] < final["batches"]["counter"]

    # v2 restored from the stop-with-savepoint: new column, counts continue exactly.
    append_lines(upi.log_dir, thirds[2])
    up = srt(["run", str(v2), *sets, "--available-now", "--from-savepoint", final["id"]], srt_env)
    assert up.returncode == 0, up.stderr[-3000:]
    want = expected_counts(LINES[:13_500])
    got = counts(db, "merchant_id, payments, payments_x2")
    assert {m: p for m, (p, _) in got.items()} == want
    touched = expected_counts(thirds[2])  # rows v2 updated carry the new column
    assert all(got[m][1] == 2 * want[m] for m in touched)

    # The early savepoint (taken mid-run) into a fresh directory: replays everything after it.
    # (On the shared session: the CLI's restore was the run above.)
    fresh = {
        "source.log_dir": upi.log_dir,
        "sink.database": db,
        "checkpoint.dir": tmp_path / "ck-early",
        "savepoint.dir": roots,
    }
    run_job(v2, fresh, from_savepoint=early["location"])
    assert {m: p for m, (p, _) in counts(db, "merchant_id, payments, payments_x2").items()} == want

    # Retention never disposes of the savepoint the registered job was restored from, also
    # after a plain restart of the restored job.
    run_job(v2, fresh)
    pruned = srt(["savepoint", "prune", "payment-counter", "--keep", "1"], srt_env)
    assert pruned.returncode == 0, pruned.stderr
    assert "0 disposed" in pruned.stdout
    refused = srt(["savepoint", "dispose", early["id"]], srt_env)
    assert refused.returncode == 2 and "restored from" in refused.stderr
    described = json.loads(srt(["savepoint", "describe", final["id"]], srt_env).stdout)
    assert described["fingerprint"]["queries"]["counter"]["operators"]["counter"]["states"] == {
        "count": "value<int>"
    }
    assert srt(["savepoint", "dispose", final["id"]], srt_env).returncode == 0
    left = json.loads(srt(["savepoint", "list", "payment-counter", "--json"], srt_env).stdout)
    assert [r["id"] for r in left] == [early["id"]]


def test_incompatible_savepoints_are_refused_with_the_differences(spark, upi, tmp_path):
    v1 = counter_job(tmp_path / "counter_v1.py")
    renamed = counter_job(tmp_path / "counter_renamed.py", state="payments_seen")
    sets = {
        "source.log_dir": upi.log_dir,
        "sink.database": tmp_path / "c.duckdb",
        "checkpoint.dir": tmp_path / "ck",
    }
    append_lines(upi.log_dir, THIRDS[0][:2000])
    run_job(v1, sets)
    sp = savepoints.create(tmp_path / "ck", tmp_path / "sp")

    # State inspection reads the same keyed state from the checkpoint and from the savepoint.
    want = expected_counts(THIRDS[0][:2000])
    for ref in (str(tmp_path / "ck"), sp.location):
        with checkpoint_of(ref, []) as ck:
            rows = inspect(spark, ck, operator="counter", state="count")
            assert {r["merchant_id"]: r["value"] for r in rows} == want
            one = inspect(spark, ck, key="M007")
            assert [(r["state"], r["value"]) for r in one] == [("count", want["M007"])]

    # Another job's savepoint.
    with pytest.raises(
        IncompatibleSavepointError,
        match="is of job 'payment-counter', this job is 'upi-per-minute'",
    ):
        run_job(
            EXAMPLES / "upi_per_minute.py",
            {"source.log_dir": upi.log_dir, "checkpoint.dir": tmp_path / "ck-upi"},
            from_savepoint=sp.location,
        )
    # State the new code no longer declares: refused, listed, and allowed with the flag.
    other = {**sets, "checkpoint.dir": tmp_path / "ck-renamed"}
    with pytest.raises(IncompatibleSavepointError) as err:
        run_job(renamed, other, from_savepoint=sp.location)
    assert err.value.differences == [
        "query counter, operator counter: state 'count' (value<int>) is no longer declared"
    ]
    assert "--allow-non-restored-state" in str(err.value)
    assert not (tmp_path / "ck-renamed").exists()  # nothing was laid out
    _, out = run_job(renamed, other, from_savepoint=sp.location, allow_non_restored_state=True)
    assert "not restored (--allow-non-restored-state)" in out

    # A corrupt file is caught by its checksum before anything is restored.
    victim = next(f for f in sp.manifest["files"] if "/keyed/" in f["path"])
    path = Path(sp.location) / victim["path"]
    path.write_bytes(path.read_bytes() + b"x")
    with pytest.raises(savepoints.SavepointError, match="is corrupt: .*" + victim["path"]):
        run_job(v1, {**sets, "checkpoint.dir": tmp_path / "ck-corrupt"}, from_savepoint=sp.location)


CRASHING_UPLOAD = textwrap.dedent("""
    import os, sys
    from stateful_runtime.checkpoints import savepoints
    try:
        savepoints.create(sys.argv[1], sys.argv[2], _fail_after_files=3)
    finally:
        os._exit(9)  # die like kill -9: no cleanup
""")


def test_s3_savepoint_crash_mid_upload_is_never_listed_and_mirror_restores_an_empty_disk(
    spark, upi, tmp_path, s3, srt_env
):
    roots = f"s3://{s3.bucket}/savepoints"
    mirror = f"s3://{s3.bucket}/mirror/upi"
    sets = upi_sets(upi, tmp_path / "ck", roots, **{"checkpoint.mirror": mirror})
    append_lines(upi.log_dir, THIRDS[0])
    _, out = run_job(EXAMPLES / "upi_per_minute.py", sets)
    uploads = [line for line in out.splitlines() if "mirror: batches" in line]
    assert len(uploads) >= 2, out

    # A savepoint whose writer dies half-way is not listed, and the next one removes it.
    crashed = subprocess.run(
        [sys.executable, "-c", CRASHING_UPLOAD, str(tmp_path / "ck"), roots],
        env=srt_env,
        capture_output=True,
        text=True,
    )
    assert crashed.returncode == 9, crashed.stderr
    half = {k.split("/")[1] for k in s3.keys("savepoints/")}
    assert len(half) == 1 and savepoints.list_savepoints(roots) == []
    good = savepoints.create(tmp_path / "ck", roots)
    assert {k.split("/")[1] for k in s3.keys("savepoints/")} == {good.id}
    assert [sp.id for sp in savepoints.list_savepoints(roots)] == [good.id]

    # Lose the disk: checkpoint gone. The mirror brings the job back, exactly once.
    shutil.rmtree(tmp_path / "ck")
    append_lines(upi.log_dir, THIRDS[1])
    _, out = run_job(EXAMPLES / "upi_per_minute.py", sets, restore_from=mirror)
    assert "restored checkpoint mirror" in out
    assert upi.table() == oracle(THIRDS[0] + THIRDS[1])


def _newest_deltas(query: QueryLayout) -> list[Path]:
    """The committed deltas of the version after the last committed batch, one a partition."""
    version = query.last_committed() + 1
    parts = sorted(p for p in (query.keyed / "counter").iterdir() if p.is_dir())
    return [d for p in parts if (d := keyed.committed(p, version, keyed.DELTA)) is not None]


def test_keyed_state_through_savepoint_rescale_damage_and_mirror(upi, tmp_path, srt_env):
    """One job of keyed state through everything built on state: a savepoint
    (its keyed files checksummed, `check` clean, inspected without Spark), a restore rescaling
    2 → 3, a truncated delta at start (falls back a batch), a mirror restore onto an empty
    disk, and a rescale 3 → 1: the counts equal the oracle's after every step."""
    job = counter_job(tmp_path / "counter.py")
    lines = LINES[:16_000]
    parts = [lines[i : i + 4_000] for i in range(0, 16_000, 4_000)]
    roots, mirror = tmp_path / "savepoints", tmp_path / "mirror"
    db = tmp_path / "c.duckdb"

    def sets(ckpt: str, parallelism: int) -> dict:
        return {
            "source.log_dir": upi.log_dir,
            "sink.database": db,
            "checkpoint.dir": tmp_path / ckpt,
            "savepoint.dir": roots,
            "parallelism": parallelism,
            **({"checkpoint.mirror": mirror} if ckpt == "ck3" else {}),
        }

    def expected(n: int) -> dict:
        return {m: (c,) for m, c in expected_counts(sum(parts[:n], [])).items()}

    append_lines(upi.log_dir, parts[0])
    run_job(job, sets("ck2", 2))
    query = QueryLayout(tmp_path / "ck2" / "counter")
    assert counts(db) == expected(1) and _newest_deltas(query)

    sp1 = savepoints.create(tmp_path / "ck2", roots)
    keyed_files = [f for f in sp1.manifest["files"] if "/keyed/counter/" in f["path"]]
    state_files = [f for f in keyed_files if not f["path"].endswith(keyed.COMMIT)]
    assert {f["path"].split("/")[3] for f in state_files} == {"0", "1"}
    # With the records naming the attempts whose files they are.
    assert any(f["path"].endswith(keyed.COMMIT) for f in keyed_files)
    assert all(len(f["sha256"]) == 64 for f in keyed_files)
    assert manifest.check(sp1) == []
    # Inspect reads the keyed files, without Spark.
    with checkpoint_of(sp1.id, [str(roots)]) as ck:
        assert not needs_spark(ck)
        rows = inspect(None, ck, operator="counter", state="count")
        assert {r["merchant_id"]: r["value"] for r in rows} == expected_counts(parts[0])
        assert all(r["key_group"] in key_groups(r["partition"], 2) for r in rows)
        (total,) = summary(ck)
    assert total["rows"] == {"count": len(rows)} and total["partitions"] == 2

    # Rescale 2 -> 3 through the savepoint.
    append_lines(upi.log_dir, parts[1])
    _, out = run_job(job, sets("ck3", 3), from_savepoint=sp1.id)
    assert "rescaling the state of counter from 2 to 3 partitions" in out
    assert counts(db) == expected(2)
    query = QueryLayout(tmp_path / "ck3" / "counter")
    assert {p.parent.name for p in _newest_deltas(query)} == {"0", "1", "2"}

    # A truncated delta of the newest version: the start falls back one batch.
    victim = _newest_deltas(query)[1]
    victim.write_bytes(victim.read_bytes()[:64])
    append_lines(upi.log_dir, parts[2])
    _, out = run_job(job, sets("ck3", 3))
    assert "keyed/counter/1/" in out and "not a readable Arrow file" in out, out
    assert any((tmp_path / "ck3" / "_quarantine").rglob(victim.name))
    assert counts(db) == expected(3)

    # The mirror carries keyed/ (the re-run's delta, an attempt of its own, not the one
    # mirrored before the damage), and an empty disk continues from it exactly once.
    mirrored = mirror_latest(str(mirror))
    assert any("/keyed/counter/2/" in f["path"] for f in mirrored.manifest["files"])
    version = keyed.version_of(victim, keyed.DELTA)
    assert version is not None
    rerun = keyed.committed(victim.parent, version, keyed.DELTA)
    assert rerun is not None and rerun.name != victim.name
    rel = f"counter/{query.relative(rerun)}"
    assert {f["path"]: f["sha256"] for f in mirrored.manifest["files"]}[rel] == sha256_file(rerun)
    append_lines(upi.log_dir, parts[3])
    run_job(job, sets("ck-empty", 3), restore_from=str(mirror))
    assert counts(db) == expected(4)

    # Rescale 3 -> 1 from a savepoint of the checkpoint before the last part.
    sp2 = savepoints.create(tmp_path / "ck3", roots)
    _, out = run_job(job, sets("ck1", 1), from_savepoint=sp2.id)
    assert "rescaling the state of counter from 3 to 1 partitions" in out
    assert counts(db) == expected(4)
    with checkpoint_of(str(tmp_path / "ck1"), []) as ck:
        rows = inspect(None, ck, state="count")
    assert {r["merchant_id"]: r["value"] for r in rows} == expected_counts(lines)
    assert {r["partition"] for r in rows} == {0}
    # The command line: the operator's line, then its rows (no Spark started).
    shown = srt(["state", "inspect", str(tmp_path / "ck1"), "--key", "M007"], srt_env)
    assert shown.returncode == 0, shown.stderr
    head, *table = shown.stdout.splitlines()
    assert head.startswith("counter/counter (batch ")
    groups = len({r["key_group"] for r in rows})
    assert f"1 partition, {groups} of 128 key groups hold state, 30 count" in head, head
    assert "key_group" in table[0] and len(table) == 2
    assert f" {expected_counts(lines)['M007']} " in table[1]

    # `srt savepoint check` (control.check_state) reads the keyed files: a delta damaged in
    # place (same size: the manifest's sizes agree) is named.
    overrides = {k: str(v) for k, v in sets("ck-check", 1).items()}
    assert check_state(job, overrides, sp2.location).compatible
    in_place = {**overrides, "checkpoint.dir": str(tmp_path / "ck1")}  # the job's checkpoint
    assert check_state(job, in_place).compatible
    entry = next(f for f in sp2.manifest["files"] if f["path"].endswith(".delta"))
    damaged = Path(sp2.location) / entry["path"]
    data = bytearray(damaged.read_bytes())
    data[8:40] = bytes(32)
    damaged.write_bytes(bytes(data))
    assert manifest.check(sp2) == []  # sizes only: a restore verifies checksums as it copies
    with pytest.raises(manifest.ManifestMismatchError, match=re.escape(entry["path"])):
        check_state(job, overrides, sp2.location)


def test_a_checkpoint_on_s3_through_savepoint_restore_in_place_rescale_and_inspect(
    upi, tmp_path, srt_env, s3
):
    """Keyed state with ``checkpoint.dir=s3://...`` (the real `srt`: its JVM starts with the
    S3A jars): a savepoint of it to S3, a restore from it into the same checkpoint (the one
    there moved aside on S3) rescaling 2 → 3, and `srt state inspect` of the checkpoint on
    S3: the counts equal the oracle's after each step."""
    job = counter_job(tmp_path / "counter.py")
    parts = [LINES[:6_000], LINES[6_000:12_000]]
    base = f"s3://{s3.bucket}/savepoint-flow"
    ckpt, roots = f"{base}/ck", f"{base}/savepoints"
    db = tmp_path / "c.duckdb"

    def run(*more: str, parallelism: int) -> str:
        sets = {
            "source.log_dir": upi.log_dir,
            "sink.database": db,
            "checkpoint.dir": ckpt,
            "parallelism": parallelism,
        }
        args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
        done = srt(["run", str(job), "--available-now", *args, *more], srt_env, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    append_lines(upi.log_dir, parts[0])
    run(parallelism=2)
    assert counts(db) == {m: (c,) for m, c in expected_counts(parts[0]).items()}

    sp = savepoints.create(ckpt, roots)
    assert sp.location == f"{roots}/{sp.id}"
    assert any("/keyed/counter/1/" in f["path"] for f in sp.manifest["files"])
    assert manifest.check(sp) == []

    append_lines(upi.log_dir, parts[1])
    out = run("--from-savepoint", sp.location, parallelism=3)
    assert f"into {ckpt}" in out and f"kept in {ckpt}.before-restore-" in out, out
    assert "rescaling the state of counter from 2 to 3 partitions" in out, out
    assert counts(db) == {m: (c,) for m, c in expected_counts(LINES[:12_000]).items()}
    keys = s3.keys("savepoint-flow/ck/counter/keyed/counter/")
    assert {k.split("/")[5] for k in keys if k.endswith(".delta")} >= {"0", "1", "2"}

    shown = srt(["state", "inspect", ckpt, "--key", "M007"], srt_env)
    assert shown.returncode == 0, shown.stderr
    head, *table = shown.stdout.splitlines()
    assert head.startswith("counter/counter (batch ") and "3 partitions" in head, head
    assert f" {expected_counts(LINES[:12_000])['M007']} " in table[1]
