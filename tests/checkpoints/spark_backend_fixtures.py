"""The checkpoints of the removed ``state.backend=spark`` (Spark's transformWithStateInPandas):
the fixtures the migration tests restore (``tests/checkpoints/test_migrate.py``).

They were made once, by ``python -m tests.checkpoints.spark_backend_fixtures`` at the last
commit that still had that backend, and are kept as they were written: they cannot be made
again. Each ``spark_backend/<name>.tar.gz`` holds a job's input in an event log (``log/``),
its checkpoint and DuckDB sink after the first half of the input (``checkpoint/``,
``sink.duckdb``; a savepoint of the checkpoint in ``savepoints/`` for some), and
``fixture.json``: the job file, its settings, the second half of the input (topic → lines), the
state the checkpoint holds as ``srt state inspect`` read it through Spark, and what the sinks
held after the spark backend ran the second half too.
"""

from __future__ import annotations

import io
import json
import random
import shutil
import sys
import tarfile
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stateful_runtime.checkpoints.layout import CheckpointLayout
from stateful_runtime.state import TimeDomain
from tests.helpers import EXAMPLES, ROOT, append_lines
from tests.operators.example_inputs import T0, M, refund_inputs, tier_inputs

HERE = Path(__file__).parent / "spark_backend"
H = 60 * M


def _payment(i: int, merchant: str, ts: int, amount: int = 100, txn: str | None = None) -> dict:
    return {"txn_id": txn or f"t{i}", "merchant_id": merchant, "amount_paise": amount, "ts_ms": ts}


def _bursts() -> dict[str, list[dict]]:
    rng = random.Random(3)
    events = []
    for minute in range(0, 30, 3):
        for m in range(6):
            start = T0 + minute * M + m * 5_000
            events += [(start + rng.randint(0, 10_000), f"M{m}") for _ in range(rng.randint(5, 20))]
    events += [(T0 + k * 2_000, f"F{k}") for k in range(30 * 30)]
    events.sort(key=lambda e: e[0] + rng.randint(0, 3_000))
    return {"upi-payments": [_payment(i, m, ts) for i, (ts, m) in enumerate(events)]}


def _duplicates() -> dict[str, list[dict]]:
    rng = random.Random(5)
    return {
        "upi-payments": [
            _payment(i, f"M{i % 7}", T0 + i * M, txn=f"t{rng.randint(0, 400)}")
            for i in range(3_000)
        ]
    }


def _sessions() -> dict[str, list[dict]]:
    rng = random.Random(9)
    out, clock = [], T0
    for _ in range(400):
        clock += rng.choice([20_000, 60_000, 5 * M, 45 * M])
        for m in rng.sample(range(4), 2):
            ts = clock + rng.randint(0, 2_000)
            out.append(_payment(len(out), f"M{m}", ts, amount=rng.randint(1, 99)))
    return {"upi-payments": out}


def _rides() -> dict[str, list[dict]]:
    rng = random.Random(4)
    rides = []
    for i in range(3_000):
        ts = T0 + int(i * (3 * H + 5 * M) / 3_000) - rng.randint(0, 4_000)
        rides.append(
            {
                "ride_id": f"r{i}",
                "PULocationID": rng.randint(1, 5),
                "total_amount": round(rng.uniform(5, 60), 2),
                "pickup_ms": ts,
            }
        )
    return {"taxi-rides": rides}


def _refunds() -> dict[str, list[dict]]:
    payments, refunds = refund_inputs()
    return {"upi-payments": payments, "upi-refunds": refunds}


def _payments_over_days() -> dict[str, list[dict]]:
    rng = random.Random(17)
    return {
        "upi-payments": [
            _payment(i, f"M{rng.randint(0, 9)}", T0 + i * 7 * M, amount=rng.randint(100, 900))
            for i in range(600)
        ]
    }


@dataclass(frozen=True)
class Fixture:
    job: Path
    inputs: Callable[[], dict[str, list[dict]]]
    settings: dict[str, Any] = field(default_factory=dict)
    savepoint: bool = False
    keys: dict[str, str] = field(default_factory=dict)  # topic → the field records are keyed by


FIXTURES = {
    "fraud_rate_limit": Fixture(
        EXAMPLES / "fraud_rate_limit.py", _bursts, {"source.max_records_per_batch": 60}, True
    ),
    "deduplicate_payments": Fixture(
        EXAMPLES / "deduplicate_payments.py", _duplicates, {"source.max_records_per_batch": 500}
    ),
    "session_summary": Fixture(
        EXAMPLES / "session_summary.py", _sessions, {"source.max_records_per_batch": 100}
    ),
    "taxi_zone_hourly": Fixture(
        EXAMPLES / "taxi_zone_hourly.py",
        _rides,
        {"early_every": 50, "source.max_records_per_batch": 400},
    ),
    "payment_refunds": Fixture(
        EXAMPLES / "payment_refunds.py", _refunds, {"source.max_records_per_batch": 8}, True
    ),
    "merchant_tiers": Fixture(
        EXAMPLES / "merchant_tiers.py", tier_inputs, {"source.max_records_per_batch": 25}
    ),
    "every_state": Fixture(HERE / "every_state.py", _payments_over_days),
    # Run until its input is read (it never ends by itself): no timer of event time to wait for.
    "every_state_processing": Fixture(
        HERE / "every_state_processing.py", _payments_over_days, savepoint=True
    ),
}


def settings_for(fixture: Fixture, root: Path) -> dict[str, str]:
    """The job's settings with its files under ``root`` (the fixture laid out)."""
    values = {
        "source.log_dir": str(root / "log"),
        "checkpoint.dir": str(root / "checkpoint"),
        "savepoint.dir": str(root / "savepoints"),
        "parallelism": "2",
        **{k: str(v) for k, v in fixture.settings.items()},
    }
    if '"sink.database"' in fixture.job.read_text():  # (a job writing DuckDB)
        values["sink.database"] = str(root / "sink.duckdb")
    return values


def append(log: Path, fixture: Fixture, lines: dict[str, list[dict]]) -> None:
    for topic, records in lines.items():
        key = fixture.keys.get(topic, "merchant_id")
        append_lines(log, [json.dumps(r).encode() for r in records], topic=topic, key=key)


def outputs(root: Path, inputs: set[str]) -> dict[str, list[str]]:
    """What the job's sinks hold: each DuckDB table but the ledger's, each event-log topic
    that is not an input, as sorted lines."""
    import duckdb

    from stateful_runtime.ledger import LEDGER_TABLE
    from tests.helpers import read_topic

    out: dict[str, list[str]] = {}
    if (root / "sink.duckdb").is_file():
        con = duckdb.connect(str(root / "sink.duckdb"), read_only=True)
        try:
            tables = con.execute("SELECT table_name FROM information_schema.tables").fetchall()
            for (table,) in tables:
                if table != LEDGER_TABLE:
                    rows = con.execute(f'SELECT * FROM "{table}"').fetchall()
                    out[f"table:{table}"] = sorted(repr(r) for r in rows)
        finally:
            con.close()
    from stateful_runtime.connectors.eventlog import EventLog

    for topic in EventLog(root / "log").topics():
        if topic.name not in inputs:
            out[f"topic:{topic.name}"] = sorted(
                r.value.decode() for r in read_topic(root / "log", topic.name)
            )
    return out


_PLACE = {"query", "operator", "state", "value", "user_map_key", "user_map_value", "partition"}
_PLACE |= {"key_group", "bytes", "batch", "broadcast"}


def canonical(value: Any) -> Any:
    """A value with its dicts as sorted items: comparable whatever order they were built in."""
    if isinstance(value, dict):
        return sorted((repr(canonical(k)), canonical(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return type(value)(canonical(v) for v in value)
    return value


def _spark_value(value: Any) -> Any:
    """A value (a map's key) as Spark's state data source shows it, ``{"v": x}`` (``{"k": x}``),
    with a processing-time TTL ``{"value": {"v": x}, "ttlExpirationMs": t}``, as the engine
    stores it: ``x``, ``(x, t)``."""
    if isinstance(value, dict) and "ttlExpirationMs" in value:
        return (_spark_value(value["value"]), value["ttlExpirationMs"])
    if isinstance(value, dict) and len(value) == 1 and set(value) <= {"k", "v"}:
        return next(iter(value.values()))
    return value


def state_of(rows: list[dict[str, Any]]) -> list[str]:
    """``srt state inspect`` rows, of either backend, as the state a job sees: one line per
    operator, key and state, a map state's entries gathered into its dict, a processing-time
    TTL's expiry beside its value, where the rows lie left out."""
    found: dict[tuple[str, str, str], Any] = {}
    for r in rows:
        key = repr(sorted((k, v) for k, v in r.items() if k not in _PLACE))
        where = (r["operator"], key, r["state"])
        if "user_map_key" in r:
            entries = found.setdefault(where, {})
            entries[_spark_value(r["user_map_key"])] = _spark_value(r["user_map_value"])
        else:
            found[where] = _spark_value(r["value"])
    return sorted(f"{op} {key} {state} = {canonical(v)!r}" for (op, key, state), v in found.items())


def read_to_the_end(root: Path, inputs: dict[str, list[dict]]) -> Callable[[], bool]:
    """Whether every query of the checkpoint under ``root`` committed a batch that read all
    of ``inputs`` (of one topic) as the log holds them now."""
    from stateful_runtime.connectors.eventlog import EventLog

    log = EventLog(root / "log")
    end = sum(sum(log.reader(t).end_offsets().values()) for t in inputs)

    def read(source: Any) -> int:
        return sum(v for k, v in source.items() if k.isdigit()) if isinstance(source, dict) else 0

    def done() -> bool:
        ckpt = CheckpointLayout(root / "checkpoint")
        if not ckpt.marker.is_file():
            return False
        for q in json.loads(ckpt.marker.read_text())["queries"]:
            committed = ckpt.query(q).committed_offsets()
            if committed is None or max(map(read, committed["sources"])) < end:
                return False
        return True

    return done


def run_job(jf: Any, root: Path, inputs: dict[str, list[dict]], **runner_args: Any) -> str:
    """Run the job to the end of its input: ``--available-now``, or, for a job in processing
    time (which never ends by itself), until every query read the whole input."""
    from stateful_runtime.planner import plan
    from stateful_runtime.runtime.runner import JobRunner
    from tests.helpers import poll

    out = io.StringIO()
    processing = any(
        getattr(q.process.function, "time_domain", None) is TimeDomain.PROCESSING_TIME
        for q in plan(jf.job).queries
        if q.process is not None
    )
    runner = JobRunner(jf, available_now=not processing, out=out, **runner_args)
    if not processing:
        assert runner.run() == 0, out.getvalue()
        return out.getvalue()
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(runner.run()), daemon=True)
    thread.start()
    done = read_to_the_end(root, inputs)
    try:
        poll(lambda: bool(codes) or done(), 300, "the job's batches")
    finally:
        runner.stop_and_wait()
        thread.join(60)
    assert codes == [0], out.getvalue()
    return out.getvalue()


def make(name: str, fixture: Fixture, spark: Any) -> Path:
    from stateful_runtime.checkpoints import savepoints
    from stateful_runtime.checkpoints.state_reader import inspect
    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.runtime.loader import load_job_file

    data = fixture.inputs()
    first = {t: r[: len(r) // 2] for t, r in data.items()}
    second = {t: r[len(r) // 2 :] for t, r in data.items()}
    with tempfile.TemporaryDirectory(prefix=f"srt-fixture-{name}-") as tmp:
        root = Path(tmp) / "run"
        for topic in data:
            EventLog(root / "log").create_topic(topic, 1)
        append(root / "log", fixture, first)
        values = {**settings_for(fixture, root), "state.backend": "spark"}

        def run() -> None:
            run_job(load_job_file(fixture.job, values), root, data)

        run()
        if fixture.savepoint:
            savepoints.create(root / "checkpoint", root / "savepoints")
        state = state_of(inspect(spark, root / "checkpoint", limit=10_000_000))
        kept = Path(tmp) / "kept"
        shutil.copytree(root, kept)
        append(root / "log", fixture, second)
        run()
        meta = {
            "job": str(fixture.job.relative_to(ROOT)),
            "settings": fixture.settings,
            "keys": fixture.keys,
            "second": second,
            "state": state,
            "outputs": outputs(root, set(data)),
        }
        (kept / "fixture.json").write_text(json.dumps(meta, indent=1))
        HERE.mkdir(exist_ok=True)
        target = HERE / f"{name}.tar.gz"
        with tarfile.open(target, "w:gz") as tar:
            for path in sorted(kept.rglob("*")):
                if path.is_file():
                    tar.add(path, arcname=str(path.relative_to(kept)))
    return target


def main(names: list[str]) -> int:
    from stateful_runtime.runtime.session import build_session

    spark = build_session(parallelism=2, master="local[2]")
    try:
        for name in names or list(FIXTURES):
            print(name, make(name, FIXTURES[name], spark), flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
