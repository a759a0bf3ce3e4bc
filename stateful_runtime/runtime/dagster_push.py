"""Committed batches pushed to Dagster as they commit: seconds, not a sensor interval.

When the job process was launched by Dagster with a webserver to report to
(``SRT_DAGSTER_URL``, and ``SRT_DAGSTER_ASSETS``: each query's sink-table asset keys, JSON
``{"query": [["upi_counts"]]}``), every committed batch of a query becomes a runless
materialisation of its tables' assets through Dagster's external-asset REST API
(``POST /report_asset_materialization/<key>``), posted by a thread of its own:

* a batch never waits for Dagster: the listener only queues it;
* Dagster down or slow: said once in the job's log, retried with backoff; a batch not reported
  within :data:`PUSH_WINDOW_S` of its commit is left to the health sensor, which reports the
  ledger's batches older than that window that no materialisation covers (so each batch is
  reported once, by one of the two);
* batches that queue up while a post is on its way go in one report (``first batch`` …
  ``last batch``), as the sensor reports them.

The metadata is the sensor's (:func:`dagster_defs._stream_events.commit_events`): batches,
first/last batch, batches committed, rows written, committed at, query, watermark.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stateful_runtime.runtime.runner import BatchCommitted

URL_ENV = "SRT_DAGSTER_URL"
ASSETS_ENV = "SRT_DAGSTER_ASSETS"
# A batch not reported this long after its commit is the health sensor's to report (it waits
# longer: dagster_defs._stream_events.PUSH_GRACE_S).
PUSH_WINDOW_S = 10.0
REQUEST_TIMEOUT_S = 3.0
MAX_BACKOFF_S = 5.0


@dataclass(frozen=True)
class Pending:
    """A committed batch of a query waiting to be reported."""

    query: str
    batch: int
    rows: int
    committed_at: float
    watermark: str | None


def from_env(job: str, say: Callable[[str], None]) -> DagsterPush | None:
    """The pusher the environment asks for (None: no ``SRT_DAGSTER_URL``)."""
    url = os.environ.get(URL_ENV, "").strip()
    if not url:
        return None
    try:
        raw = json.loads(os.environ.get(ASSETS_ENV) or "{}")
        assets = {str(q): [[str(p) for p in key] for key in keys] for q, keys in raw.items()}
    except (ValueError, TypeError, AttributeError):
        say(f"{ASSETS_ENV} is not JSON of query -> asset keys; not reporting to Dagster")
        return None
    return DagsterPush(job, url, assets, say)


class DagsterPush:
    """An ``on_batch`` listener posting each committed batch to Dagster from its own thread."""

    def __init__(
        self,
        job: str,
        url: str,
        assets: Mapping[str, Sequence[Sequence[str]]],
        say: Callable[[str], None],
    ) -> None:
        self.job, self.url, self.assets, self.say = job, url.rstrip("/"), assets, say
        self.pending: queue.SimpleQueue[Pending] = queue.SimpleQueue()
        self.reported: dict[str, int] = {}  # query -> last batch reported
        self.failing = False
        self.posted = 0
        self._thread = threading.Thread(target=self._run, name="srt-dagster-push", daemon=True)
        self._thread.start()

    def __call__(self, event: BatchCommitted) -> None:
        if event.query not in self.assets:
            return
        batch = event.health.batch
        self.pending.put(
            Pending(
                event.query,
                event.batch_id,
                int(event.sink_rows if event.sink_rows is not None else event.input_rows),
                time.time(),
                None if batch is None else batch.watermark,
            )
        )

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        backlog: list[Pending] = []
        backoff = 0.5
        while True:
            if not backlog:
                backlog.append(self.pending.get())
            while True:
                try:
                    backlog.append(self.pending.get_nowait())
                except queue.Empty:
                    break
            now = time.time()
            backlog = [
                p
                for p in backlog
                if p.batch > self.reported.get(p.query, -1)
                and now - p.committed_at < PUSH_WINDOW_S - REQUEST_TIMEOUT_S
            ]
            if not backlog:
                continue
            try:
                for query in sorted({p.query for p in backlog}):
                    mine = sorted((p for p in backlog if p.query == query), key=lambda p: p.batch)
                    for key in self.assets[query]:
                        self._post(key, mine)
                    self.reported[query] = mine[-1].batch
                    backlog = [p for p in backlog if p.query != query]
            except OSError as exc:  # URLError, HTTPError, timeouts, refused connections
                if not self.failing:
                    self.say(
                        f"could not report a commit to Dagster at {self.url} ({exc}); retrying, "
                        f"and the health sensor reports what this cannot"
                    )
                    self.failing = True
                time.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            if self.failing:
                self.say(f"reporting commits to Dagster at {self.url} again")
                self.failing = False
            backoff = 0.5

    def _post(self, key: Sequence[str], batches: Sequence[Pending]) -> None:
        first, last = batches[0], batches[-1]
        rows = sum(p.rows for p in batches)
        metadata: dict[str, Any] = {
            "batches": f"{first.batch}" if first is last else f"{first.batch}–{last.batch}",
            "first batch": first.batch,
            "last batch": last.batch,
            "batches committed": len(batches),
            "rows written": rows,
            "committed at": datetime.fromtimestamp(last.committed_at, UTC).isoformat(),
            "query": last.query,
            "reported by": "job process",
        }
        watermark = last.watermark
        if watermark and not str(watermark).startswith("1970-01-01T00:00:00"):
            metadata["watermark"] = str(watermark)
        what = f"batch {last.batch}" if first is last else f"batches {first.batch}–{last.batch}"
        body = {
            "metadata": metadata,
            "description": f"{self.job} committed {what} to {key[-1]} ({rows:,} rows)",
        }
        path = "/".join(urllib.parse.quote(part, safe="") for part in key)
        request = urllib.request.Request(
            f"{self.url}/report_asset_materialization/{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as answer:
            answer.read()
        self.posted += 1
