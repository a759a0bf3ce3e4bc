"""Step isolation end to end (``srt run`` on the embedded event log, the job in
``isolation_job.py``): a map that raises for one amount and a keyed process function that
raises for one merchant after changing its state. The rest of every batch commits, the
dead-letter topic holds exactly the records they raised on with the step and the reason, the
key's state is as if the failed elements never came, the accounting identity holds, a kill -9
between the commit and the publication (or between the publication and removing the staged
files) publishes each record once, and under ``errors.policy=fail`` the stopped job names the
record and the ``srt run --skip`` command that passes it, exactly once."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from stateful_runtime.connectors.eventlog import EventLog
from tests.helpers import append_lines, kill_group, poll, srt, srt_background

pytestmark = pytest.mark.slow

JOB = Path(__file__).with_name("isolation_job.py")
T0 = 1_767_225_600_000


def payments(seed: int, n: int = 300) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        merchant = rng.choice(["M1", "M2", "M3", "BAD"])
        amount = rng.randint(20, 90)
        if i % 61 == 7:
            amount = 13  # the map raises
        elif merchant == "BAD" and i % 23 == 5:
            amount = 150  # the process function raises (doubled: 300 > 200)
        out.append({"txn_id": f"t{i}", "merchant_id": merchant, "amount": amount, "ts_ms": T0 + i})
    return out


def fails_in(p: dict) -> str | None:
    if p["amount"] == 13:
        return "double"
    if p["merchant_id"] == "BAD" and p["amount"] * 2 > 200:
        return "totals"
    return None


class Workspace:
    def __init__(self, root: Path, records: list[dict], *sets: str) -> None:
        self.root, self.records = root, records
        self.log_dir = root / "log"
        EventLog(self.log_dir).create_topic("payments", 2)
        append_lines(self.log_dir, [json.dumps(p).encode() for p in records], topic="payments")
        self.sets = [
            "--set",
            f"source.log_dir={self.log_dir}",
            "--set",
            f"checkpoint.dir={root / 'checkpoints'}",
            *sets,
        ]

    def run_args(self, *more: str) -> list[str]:
        return ["run", str(JOB), *self.sets, *more]

    def topic(self, name: str) -> list:
        log = EventLog(self.log_dir)
        if name not in {t.name for t in log.topics()}:
            return []
        reader = log.reader(name)
        try:
            return [r for p, end in reader.end_offsets().items() for r in reader.read(p, 0, end)]
        finally:
            reader.close()

    def dead_letters(self) -> dict[str, tuple[str, str]]:
        """txn_id -> (step header, error header) of each dead letter; each must be there once."""
        out: dict[str, tuple[str, str]] = {}
        for r in self.topic("payments-dlq"):
            txn = json.loads(r.value)["txn_id"]
            assert txn not in out, f"{txn} dead-lettered twice"
            out[txn] = (r.headers["step"], r.headers["error"])
        return out

    def check_outputs(self) -> None:
        """Every good record made one output row; each merchant's running total and count of
        ids are those of its good records only (the failed elements changed no state)."""
        rows = [json.loads(r.value) for r in self.topic("totals")]
        good = [p for p in self.records if fails_in(p) is None]
        assert sorted(r["txn_id"] for r in rows) == sorted(p["txn_id"] for p in good)
        for merchant in {p["merchant_id"] for p in good}:
            mine = [p for p in good if p["merchant_id"] == merchant]
            last = max((r for r in rows if r["merchant_id"] == merchant), key=lambda r: r["ids"])
            assert last["total"] == sum(2 * p["amount"] for p in mine)
            assert last["ids"] == len(mine)

    def check_dead_letters(self) -> None:
        letters = self.dead_letters()
        expected = {p["txn_id"]: fails_in(p) for p in self.records if fails_in(p)}
        assert {t: step for t, (step, _) in letters.items()} == expected
        # each names the partition and offset its record has in the source topic
        where = {
            json.loads(r.value)["txn_id"]: (str(r.partition), str(r.offset))
            for r in self.topic("payments")
        }
        named = {
            json.loads(r.value)["txn_id"]: (
                r.headers["source.partition"],
                r.headers["source.offset"],
            )
            for r in self.topic("payments-dlq")
        }
        assert named == {t: where[t] for t in expected}
        for step, error in letters.values():
            if step == "double":
                assert error.startswith("double: the map function raised ValueError: unlucky")
            else:
                assert error.startswith("totals: process_element raised RuntimeError: cannot")
                assert "the key's state is as before it" in error


def test_failed_records_are_dead_lettered_the_rest_commits_and_the_identity_holds(
    tmp_path, srt_env
):
    ws = Workspace(tmp_path, payments(1))
    result = srt(ws.run_args("--available-now"), srt_env)
    assert result.returncode == 0, result.stderr[-3000:]
    ws.check_outputs()
    ws.check_dead_letters()
    status = json.loads(srt(["status", "isolation", "--json"], srt_env).stdout)[0]
    [health] = status["health"].values()  # the one query
    records = health["records"]
    dead = sum(1 for p in ws.records if fails_in(p))
    assert records["input"] == len(ws.records)
    assert records["dead_letters"] == dead
    assert records["input"] == records["output"] + records["dead_letters"] + records["late"]
    assert "dead letters" in result.stdout


@pytest.mark.faults
@pytest.mark.parametrize("point", ["before", "after"])
def test_a_kill_between_the_commit_and_the_publication_publishes_each_once(
    tmp_path, srt_env, point
):
    ws = Workspace(tmp_path, payments(2))
    hook = tmp_path / "hook"
    env = {**srt_env, "SRT_TEST_STEP_DLQ_HOOK": str(hook), "SRT_TEST_STEP_DLQ_POINT": point}
    proc = srt_background(ws.run_args(), env, tmp_path / "first.log")
    try:
        poll(lambda: list(hook.glob(f"{point}-*")), 300, f"the job to reach {point!r}")
    finally:
        kill_group(proc)
    if point == "before":
        assert ws.topic("payments-dlq") == []  # committed, not yet published
    result = srt(ws.run_args("--available-now"), srt_env)
    assert result.returncode == 0, result.stderr[-3000:]
    ws.check_dead_letters()
    ws.check_outputs()


def test_a_stopped_job_names_the_record_and_the_skip_command_passes_it_once(tmp_path, srt_env):
    records = [p for p in payments(3, 100) if fails_in(p) != "totals"]  # two map failures
    assert sum(1 for p in records if fails_in(p)) == 2
    ws = Workspace(tmp_path, records, "--set", "errors.policy=fail")
    first = [p for p in records if fails_in(p)][0]
    # the offset the log gave the first failing record, as the error names it
    where = next(
        (r.partition, r.offset)
        for r in ws.topic("payments")
        if json.loads(r.value)["txn_id"] == first["txn_id"]
    )
    failed = srt(ws.run_args("--available-now"), srt_env)
    assert failed.returncode != 0
    named = f"payments:{where[0]}:{where[1]}"
    assert f"srt run {JOB} --skip {named}" in failed.stderr + failed.stdout
    assert ws.topic("totals") == []  # nothing of the failed batch committed
    skipped = []
    for _ in records:  # one --skip per failing record, as a team would do it
        result = srt(ws.run_args("--available-now", "--skip", named), srt_env)
        skipped.append(named)
        if result.returncode == 0:
            break
        output = (result.stderr + result.stdout).splitlines()
        found = [line for line in output if "--skip payments:" in line]
        assert found, (result.returncode, result.stdout[-2000:], result.stderr[-3000:])
        named = found[-1].rsplit("--skip ", 1)[1].split()[0]
    assert result.returncode == 0, result.stderr[-3000:]
    again = srt(ws.run_args("--available-now"), srt_env)  # replays nothing, skips nothing twice
    assert again.returncode == 0, again.stderr[-3000:]
    letters = ws.topic("payments-dlq")
    assert sorted(json.loads(r.value)["txn_id"] for r in letters) == sorted(
        p["txn_id"] for p in records if fails_in(p)
    )
    assert all(r.headers["error"].startswith("skip: skipped by operator") for r in letters)
    assert all(r.headers["step"] == "skip" for r in letters)
    rows = [json.loads(r.value) for r in ws.topic("totals")]
    assert sorted(r["txn_id"] for r in rows) == sorted(
        p["txn_id"] for p in records if not fails_in(p)
    )
