"""A failed query's cause, said for people: which step, why, and the way on.

Spark reports a failed micro-batch as its error class wrapped in a JVM stack, or a Python
traceback, followed by the whole logical plan. Two kinds of failure stop a batch on every
replay, and this names them:

* **an arithmetic overflow inside Spark's own operators** (``ARITHMETIC_OVERFLOW``,
  ``NUMERIC_VALUE_OUT_OF_RANGE``...; e.g. a ``Sum(field, wide=False)`` past int64): no record
  can be isolated there (a sum is the whole group's), so the job stops, naming the step, the
  reason, the batch and its offsets per source partition, and the ways on: the wide sum, or
  ``srt run --skip`` of the record that tips it;
* **a runtime error raised in a Spark task** (a :class:`~stateful_runtime.exceptions.SinkError`
  from an executor's write, say a value the sink's table cannot store): its own message, which
  says what to do, without the traceback around it;
* **a Python worker that died in a task** (killed by the kernel's OOM killer or a signal, a
  crash in native code) once more than a task's attempts allow (a local master retries a task
  as a cluster does, ``session.LOCAL_TASK_ATTEMPTS``): nothing of the batch is committed, and
  the way on is to give the workers memory and run the job again;
* **a Python worker that did not connect back** within Spark's fixed 10 s (a process Spark
  starts on its own, as for a Python source: a machine too loaded to start it in time): nothing
  of the batch is committed, and the way on is ``srt-python`` (``runtime/python_worker.py``),
  which the job uses unless ``PYSPARK_PYTHON`` names another interpreter, or a lower load.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from stateful_runtime.planner import NativeWindowNode, ProcessNode, native_aggregates

if TYPE_CHECKING:
    from stateful_runtime.checkpoints.layout import QueryLayout
    from stateful_runtime.planner import QueryPlan

_OVERFLOW = re.compile(
    r"\[((?:ARITHMETIC_OVERFLOW|NUMERIC_VALUE_OUT_OF_RANGE|CAST_OVERFLOW|"
    r"BINARY_ARITHMETIC_OVERFLOW|DECIMAL_PRECISION_EXCEEDS_MAX_PRECISION|"
    r"INTERVAL_ARITHMETIC_OVERFLOW)[A-Z_.]*)\]\s*([^\n]*?)"
    r"(?:\s+Use '|\s+If necessary|\s+SQLSTATE|$)",
    re.MULTILINE,
)
# The runtime's own errors, raised in a task: the last line of the Python traceback.
_RUNTIME_ERROR = re.compile(
    r"(?:stateful_runtime|dbt_sink)\.exceptions\.(\w+Error): (.+?)(?:\n\n|\n\tat |\n[A-Za-z]+"
    r"(?:\.[A-Za-z]+)+(?:Exception|Error)|\Z)",
    re.DOTALL,
)


_WORKER_DIED = re.compile(r"Python worker exited unexpectedly \(crashed\)")
_NO_CONNECT = re.compile(r"Python worker failed to connect back")
_ATTEMPTS = re.compile(r"failed (\d+) times")


def explain(reason: str, query: QueryPlan, layout: QueryLayout, job_file: str) -> str | None:
    """What to print for query ``query``'s failure ``reason`` (Spark's text), or None when
    it is none of the kinds above (the reason is printed as it is)."""
    if m := _OVERFLOW.search(reason):
        return _overflow(m.group(1), m.group(2).strip().rstrip("."), query, layout, job_file)
    if m := _RUNTIME_ERROR.search(reason):
        return f"{m.group(1)}: {' '.join(m.group(2).split())}"
    if _WORKER_DIED.search(reason):
        return _worker_died(reason, query, layout, job_file)
    if _NO_CONNECT.search(reason):
        return no_connect(job_file)
    return None


def no_connect(job_file: str) -> str:
    """What to say of a Python worker Spark gave up on at its start (see the module doc)."""
    python = os.environ.get("PYSPARK_PYTHON", "")
    which = (
        f"PYSPARK_PYTHON ({python}) runs the workers without srt-python, which connects first: "
        f"unset it, or point it at srt-python in the job's environment"
        if os.path.basename(python) != "srt-python"
        else "the machine is too loaded to start even srt-python in time: run it with less load"
    )
    return (
        f"a Python worker Spark started did not connect back within Spark's fixed 10 s (its "
        f"imports ran slower than that: the machine is loaded); nothing of the batch in flight "
        f"is committed. {which[0].upper()}{which[1:]}, then srt run {job_file} resumes where "
        f"the job stopped, exactly once"
    )


def _worker_died(reason: str, query: QueryPlan, layout: QueryLayout, job_file: str) -> str:
    batch, _ = _offsets(query, layout)
    which = f"batch {batch}" if batch is not None else "the batch in flight"
    attempts = _ATTEMPTS.search(reason)
    times = f" {attempts.group(1)} times" if attempts else ""
    return (
        f"a Python worker running query {query.name!r} died{times} (killed: out of memory or "
        f"a signal, or crashed; `dmesg` names the OOM killer): {which} is not committed and "
        f"nothing of it reached a sink. Give the workers memory (fewer keys or records per "
        f"batch: source.max_records_per_batch; the state backend's memory settings, "
        f"srt explain {job_file}) and run the job again: srt run {job_file} resumes from "
        f"{which}, exactly once"
    )


def _step(query: QueryPlan) -> str:
    """The step a Spark arithmetic error comes from: the query's stateful operator."""
    for node in reversed(query.nodes):
        if isinstance(node, NativeWindowNode):
            return f"step {node.name!r} (Spark's window aggregation: {native_aggregates(node)})"
        if isinstance(node, ProcessNode):
            return f"step {node.name!r}"
    return f"query {query.name!r} (a filter or a Spark expression)"


def _offsets(query: QueryPlan, layout: QueryLayout) -> tuple[int | None, str]:
    """The batch that failed (planned, not committed) and its offsets per source partition."""
    planned, committed = layout.last_planned(), layout.last_committed()
    if planned is None or (committed is not None and planned <= committed):
        return None, ""
    try:
        end = (layout.committed_offsets(planned) or {}).get("sources") or [{}]
        start = (
            (layout.committed_offsets(planned - 1) or {}).get("sources") or [{}]
            if planned > 0
            else [{}]
        )
    except (OSError, ValueError, IndexError):
        return planned, ""
    if not isinstance(end[0], dict):
        return planned, ""
    before = start[0] if isinstance(start[0], dict) else {}
    ranges = [
        f"partition {p}: offsets {int(before.get(p, 0))}..{int(e) - 1}"
        for p, e in sorted(end[0].items(), key=lambda kv: str(kv[0]).zfill(12))
        if int(e) > int(before.get(p, 0))
    ]
    return planned, "; ".join(ranges)


def _overflow(error: str, detail: str, query: QueryPlan, layout: QueryLayout, job_file: str) -> str:
    batch, ranges = _offsets(query, layout)
    which = f"batch {batch}" if batch is not None else "the batch"
    where = f" (source {query.source.name!r}, {ranges})" if ranges else ""
    return (
        f"{_step(query)}: an arithmetic overflow in Spark ([{error}] {detail}). No single "
        f"record can be isolated inside Spark's aggregation, so the job stopped: {which}"
        f"{where} is not committed, and it fails the same way each time it is replayed. "
        f"Ways on: sum integral fields wide (Sum(field) sums in decimal(38,0); "
        f"Sum(field, wide=False) keeps bigint, which overflows), on a new checkpoint.dir if "
        f"the old state holds bigint sums; or pass the record that tips it: srt run "
        f"{job_file} --skip {query.source.name}:<partition>:<offset> (it goes to the "
        f"dead-letter topic), the record among the offsets above"
    )
