"""The S3 endpoint goes away while the UPI job runs: during a savepoint and during the mirror.

The job (event log in, DuckDB out) mirrors its checkpoint to S3 after every batch and keeps
its savepoints on S3, both through a proxy in front of moto's server (its data survives the
outage). The proxy dies the moment the savepoint uploads its first checkpoint file (after its
writer record), and stays down for several committed batches. Expected: the savepoint fails
cleanly and is never listed; the job keeps committing; when S3 is back the mirror catches up
(its newest manifest names the last committed batch, every file there with its size) and a
new savepoint succeeds; the table equals the oracle of everything fed; dead letters once.
"""

from __future__ import annotations

import json
import re
import time
import uuid

import pytest
from upi_events import bad_lines, oracle

from stateful_runtime.checkpoints.layout import QueryLayout
from tests.faults.harness import (
    JOB,
    QUERY,
    Feeder,
    OutageProxy,
    caught_up,
    compare,
    dead_letters,
    log_end,
)
from tests.helpers import srt, srt_background, wait_for

pytestmark = pytest.mark.faults

FAULT_SP = "S3 endpoint down during a savepoint"
FAULT_MIRROR = "S3 endpoint down during the checkpoint mirror"
INPUT = "UPI events appended while the job runs (1 bad record in 997)"


def _mirror_batch(s3, prefix: str) -> tuple[int | None, list[str]]:
    """(batch of the mirror's newest manifest, its files missing or of another size in S3)."""
    client = s3.client()
    names = sorted(k for k in s3.keys(f"{prefix}/_mirror/") if k.endswith(".json"))
    if not names:
        return None, []
    manifest = json.loads(client.get_object(Bucket=s3.bucket, Key=names[-1])["Body"].read())
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix)
    sizes = {o["Key"][len(prefix) + 1 :]: o["Size"] for p in pages for o in p.get("Contents", [])}
    bad = [f["path"] for f in manifest["files"] if sizes.get(f["path"]) != f["size"]]
    return manifest["queries"][QUERY]["batch"], bad


def _savepoints(env) -> list[str]:
    listed = srt(["savepoint", "list", JOB, "--json"], env)
    assert listed.returncode == 0, listed.stderr
    return [sp["id"] for sp in json.loads(listed.stdout)]


def test_s3_down_during_savepoint_and_mirror_job_keeps_running_mirror_catches_up(
    upi, srt_env, s3, job_env, trials
):
    host, port = s3.url.removeprefix("http://").split(":")
    proxy = OutageProxy(host, int(port))
    run = uuid.uuid4().hex[:8]
    mirror, sp_prefix = f"faults/{run}/mirror", f"faults/{run}/savepoints"
    upi.extra.update(
        {
            "checkpoint.mirror": f"s3://{s3.bucket}/{mirror}",
            "savepoint.dir": f"s3://{s3.bucket}/{sp_prefix}",
            "checkpoint.interval_s": "0.5",
            "parallelism": "2",
        }
    )
    # A home of its own: `savepoint list` also lists the default root under $SRT_HOME, where
    # another test's savepoint of the same job may be.
    home = {"SRT_HOME": str(upi.root / "srt-home")}
    env = {**job_env, **home, "SRT_S3_ENDPOINT_URL": proxy.url}
    qdir = upi.checkpoint_dir / QUERY
    feeder = Feeder(upi.log_dir, seed=17, chunk=100)
    log = upi.root / "run.log"
    proc = srt_background(upi.run_args(), env, log)
    try:
        wait_for(
            lambda: (_mirror_batch(s3, mirror)[0] or -1) >= 0,
            proc,
            log,
            "a mirrored batch",
            timeout=300,
        )

        # S3 dies when the savepoint sends its first checkpoint file.
        proxy.cut_on(
            rb"PUT /"
            + s3.bucket.encode()
            + rb"/"
            + sp_prefix.encode()
            + rb"/[^/ ]+/"
            + QUERY.encode()
            + rb"/[^ ]+"
        )
        t0 = time.monotonic()
        failed = srt(["savepoint", "create", JOB, "--json"], env, timeout=300)
        cut = proxy.cut_hit
        sp_detail = (
            f"cut at {cut!r}; savepoint exit {failed.returncode}: {failed.stderr.strip()[-300:]}"
        )
        assert cut is not None, f"the savepoint never uploaded a file: {failed.stdout}"
        sid = re.search(rf"/{sp_prefix}/([^/ ]+)/", cut).group(1)
        down_at = QueryLayout(qdir).last_committed()
        # Down for a while: the job keeps committing (the mirror fails after each batch).
        wait_for(
            lambda: QueryLayout(qdir).last_committed() >= down_at + 3,
            proc,
            log,
            "3 batches committed while S3 is down",
            timeout=300,
        )
        mirrored_while_down = _mirror_batch(s3, mirror)[0]
        outage_s = round(time.monotonic() - t0, 1)
        proxy.up()
        target = QueryLayout(qdir).last_committed()
        wait_for(
            lambda: (_mirror_batch(s3, mirror)[0] or -1) >= target,
            proc,
            log,
            "the mirror to catch up",
            timeout=300,
        )
        listed_after_outage = _savepoints(env)
        ok = srt(["savepoint", "create", JOB, "--json"], env, timeout=300)

        fed = feeder.stop()
        ends = log_end(upi.log_dir)
        wait_for(
            lambda: caught_up(qdir, ends), proc, log, "the job to read everything", timeout=300
        )
        stopped = srt(["stop", JOB], env, timeout=300)
        proc.wait(timeout=300)
    finally:
        feeder.stop()
        if proc.poll() is None:
            proc.kill()
        proxy.down()

    out = log.read_text()
    cmp = compare(upi.table(), oracle(fed))
    batch, missing = _mirror_batch(s3, mirror)
    listed = _savepoints({**srt_env, **home})  # straight to moto: the proxy is gone
    sp_ok = (
        failed.returncode != 0
        and sid not in listed_after_outage
        and sid not in listed
        and ok.returncode == 0
        and len(listed) == 1
    )
    mirror_ok = (
        mirrored_while_down is not None
        and mirrored_while_down <= down_at
        and batch == QueryLayout(qdir).last_committed()
        and not missing
    )
    trials.record(
        fault=FAULT_SP,
        input=INPUT,
        result="pass" if sp_ok and cmp.exact else "FAIL",
        detail=f"{sp_detail}; listed after: {listed}",
        lost=cmp.lost,
        duplicated=cmp.duplicated,
        outage_s=outage_s,
    )
    trials.record(
        fault=FAULT_MIRROR,
        input=INPUT,
        result="pass" if mirror_ok and cmp.exact else "FAIL",
        detail=f"mirror at batch {mirrored_while_down} while down (down at {down_at}), "
        f"caught up to {batch} (last committed {QueryLayout(qdir).last_committed()}), "
        f"{len(missing)} files missing",
        lost=cmp.lost,
        duplicated=cmp.duplicated,
        outage_s=outage_s,
    )
    assert failed.returncode != 0, f"the savepoint did not fail: {failed.stdout}"
    assert sid not in listed_after_outage and sid not in listed, (sid, listed)
    assert ok.returncode == 0 and len(listed) == 1, ok.stderr[-2000:]
    assert stopped.returncode == 0 and proc.returncode == 0, out[-3000:]
    assert mirror_ok, (mirrored_while_down, down_at, batch, missing)
    assert cmp.exact, cmp
    assert dead_letters(upi.log_dir) == bad_lines(fed)
