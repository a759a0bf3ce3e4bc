"""What ``srt run`` prints: one line per committed micro-batch, notes, and the summary at the end.

Every line starts with ``[<job>]``; failures go to stderr, everything else to the runner's
output stream (stdout, or what a test or benchmark passes).
"""

from __future__ import annotations

import sys
from typing import IO, TYPE_CHECKING, Any

from stateful_runtime.contract import BatchHealth, RecordCounts

if TYPE_CHECKING:
    from pathlib import Path

    from stateful_runtime.checkpoints.mirror import MirrorSync
    from stateful_runtime.planner import QueryPlan


def _fmt_int(n: Any) -> str:
    return f"{int(n):,}" if isinstance(n, int | float) else "-"


class Console:
    """The job process's terminal output (``out``: progress and notes; failures to stderr)."""

    def __init__(self, job: str, out: IO[str]) -> None:
        self.job = job
        self.out = out

    def say(self, text: str) -> None:
        print(f"[{self.job}] {text}", file=self.out, flush=True)

    def error(self, text: str) -> None:
        print(f"[{self.job}] {text}", file=sys.stderr, flush=True)

    def running(
        self, queries: int, master: str, checkpoint_dir: Path, note: str | None = None
    ) -> None:
        self.say(
            f"running {queries} {'query' if queries == 1 else 'queries'} on {master}"
            + (f" ({note})" if note else "")
            + f"; checkpoints in {checkpoint_dir}"
        )

    def batch(self, query: QueryPlan, h: BatchHealth) -> None:
        """The progress line of one committed micro-batch."""
        parts = [
            f"[{self.job}] {query.name} batch {h.last_batch}",
            f"rows {_fmt_int(h.input_rows)}",
            f"{_fmt_int(h.processed_rows_per_s)} rows/s",
            f"{_fmt_int(h.batch_duration_ms)} ms",
        ]
        if query.stateful_operators:
            held = f" (held by {h.watermark_held_by})" if h.watermark_held_by else ""
            parts += [
                f"watermark {h.watermark or '-'}{held}",
                f"state {_fmt_int(h.state_rows)} rows",
                f"late-dropped {_fmt_int(h.late_rows_dropped_this_run)}",
            ]
        if query.dead_letters is not None:
            parts.append(f"dead letters {query.dead_letters.sink.records():,}")
        if h.lag_records is not None:
            parts.append(f"lag {_fmt_int(h.lag_records)}")
        print(" | ".join(parts), file=self.out, flush=True)

    def mirror(self, done: MirrorSync, location: str) -> None:
        share = done.bytes_uploaded / done.bytes_referenced if done.bytes_referenced else 0.0
        self.say(
            f"mirror: batches {done.batches} -> {location}: "
            f"{done.files_uploaded} files, {done.bytes_uploaded:,} bytes uploaded "
            f"({share:.1%} of {done.bytes_referenced:,} bytes of checkpoint)"
        )

    def sink_summary(self, sink: Any) -> None:
        """A sink's own summary table (``Sink.summary``), if it has one."""
        summary = sink.summary()
        if summary is None:
            return
        print(f"\n{summary.title}", file=self.out)
        if not summary.columns:
            return
        cells = [[str(c) for c in summary.columns]] + [[str(v) for v in r] for r in summary.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(summary.columns))]
        for i, row in enumerate(cells):
            print(
                "  " + "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)),
                file=self.out,
            )
            if i == 0:
                print("  " + "  ".join("-" * w for w in widths), file=self.out)
        self.out.flush()

    def records(self, query: str, r: RecordCounts) -> None:
        for one in (*r.by_source, r):  # a union's inputs, then the query's totals
            print(
                f"\nrecords of {query} from source {one.source} (this run): "
                f"input {one.input:,} = output {one.output:,} + dead letters "
                f"{one.dead_letters:,} + late {one.late:,}",
                file=self.out,
                flush=True,
            )
