"""Render RELIABILITY.md from the fault trials recorded in tests/artifacts/faults/*.json.

    python -m tests.faults.report [--out RELIABILITY.md] [--runs DIR]

Every pytest run of tests/faults (``trials`` fixture) and every ``platform/fault-trials.sh``
run writes one JSON file there (gitignored); this sums them per fault and input class.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from tests.faults.harness import ARTIFACTS, ROOT

HEADER = """\
# Reliability

Rendered by `python -m tests.faults.report` from the trial records that the fault-injection
suite writes to `tests/artifacts/faults/` (one JSON file per run): do not edit the tables by
hand. Every trial is checked against an **oracle computed from the input alone** (the UPI
per-merchant, per-minute counts of every good record, `examples/upi_events.oracle`), never
from the job's own output: **lost** = payments the oracle counts and the sink does not,
**duplicated** = payments the sink counts more often than the oracle. A trial passes only with
0 lost and 0 duplicated (and each dead letter published exactly once where it says so).

How to run:

* CI (`platform/test.sh`, marker `faults`): `pytest -m faults tests/faults` — 20 kill -9
  trials with a fresh seed each run, the other faults once each, checkpoint damage cases.
  Replay a kill run with `SRT_FAULT_SEED=<seed>`.
* Outside CI: `platform/fault-trials.sh 100` — 100 kill -9 trials (prints a table: trial,
  seed, kill point, batches committed before the kill, result), then the slower variants.

## Faults and results

{faults}

Kill points hit by the kill -9 trials ({kill_total} trials): {kill_points}.

## Runs

{runs}

## Input classes: decoder outcomes and the accounting identity

`tests/faults/test_input_classes.py` runs the UPI job (`srt run --available-now`, twice) over
one record of each input class, good and bad interleaved, then records behind the watermark the
first run left. Expected fate is the oracle's; observed is where the record was found (the
dead-letter topic, byte for byte, with the reason in its `error` header; the sink table's sums).

{inputs}

The counters of the identity `output + dead letters + late = input`, per source, from `srt status
--json` (`health[query].records`) summed over the runs, against the oracle's (the corpus's
classes; `output` against the sink table's sums):

{identity}

## Control endpoint: malformed requests

Tried against a running UPI job's endpoint (token given): `Content-Length: abc` and a
`timeout` of `"abc"` dropped the connection and printed a traceback in the job's log;
`Content-Length: -1` read the whole body past the 64 KiB limit; a `timeout` of -5 stopped the
job and answered 409; a relative target (`../../x`) was written under the job's working
directory; `/proc` answered 500. Now every header and field is checked before the job is asked
anything (`stateful_runtime/runtime/endpoint.py`: `parse_content_length`, `parse_body`,
`check_target`): Content-Length decimal digits only and at most 64 KiB (413 above it, 411 for
a chunked body), a JSON object without NaN or Infinity, only the path's fields (`savepoint` a
boolean, `timeout` finite seconds in (0, 86400]), a target absolute (or `s3://`), normalised,
inside `savepoint.roots` when set, and probed writable (400 saying what to give) before a stop
begins; the standard library's own refusals (bad request line, unsupported method: 405) are
error documents too, and nothing is printed. Trials: `tests/runtime/test_endpoint_boundary.py`
(a real endpoint on a real socket, raw bytes; Hypothesis: 150 hostile requests — any method,
path, token, Content-Length text, body bytes — and 200 generated JSON bodies per run: every
one answered, 4xx error documents only, no call reaching the job with a field out of its
contract, no traceback; five of its six tests fail on the previous endpoint) and
`tests/runtime/test_endpoint.py::test_malformed_requests_get_4xx_and_the_job_runs_on` (the
issue's cases against a running job: each 400/413, the job still RUNNING, its log clean).

## Command line: closed pipes and numbers

Tried: `srt log read ... | head` ended in `BrokenPipeError` (every printing command did);
`--set checkpoint.interval_s=nan` or `inf` gave raw tracebacks, `-1` printed
`datetime.timedelta(days=-1, seconds=86399)`; `--timeout nan`, `--max-age infd`, `--limit -3`
went through. Now a closed stdout ends `srt` quietly with 141 (what a shell gives a command
SIGPIPE ended); every numeric `--set` key and the job file's own DEFAULTS are checked where
config enters (`stateful_runtime/job.py` `check_number`, used by `runtime/loader.py`):
finite, and a duration (a key ending `_s`, `_ms`, `_minutes`...) from 0 to ~30 years, a count
(`parallelism`, `..partitions`, `max_..`) 0 or more, refused with the key, the value and the
unit; every duration and count flag of `srt` is parsed the same way. Trials:
`tests/runtime/test_loader.py` (Hypothesis: 120 numeric texts — NaN, infinities, negatives,
overflowing floats — per run for five keys: loaded finite and in range, or a `ConfigError`
naming the key in its units) and `tests/test_cli.py` (four commands with their reader gone
before or after the first line: no output on stderr, exit 141; ten flags and the issue's three
intervals: exit 2 with a message, no traceback).

`srt run ... | head` was worse than a traceback: the thread that copies the job's terminal
output (`runtime/spark_output.py`) died on the closed pipe, and the job, its JVM and its workers
would block once the pipe filled. Now that thread keeps draining the pipe and drops the lines;
the run goes on and ends as it would (its log files keep Spark's lines). Trial:
`tests/runtime/test_spark_output.py` (20,000 lines written after the reader went away: exit 0,
nothing on stderr; it fails without the fix), and a real `srt run --available-now` with its
reader gone after the first line: exit 0, stderr empty.

Tried: `srt run --available-now` with nothing to do printed `ERROR ... Python worker exited
unexpectedly (crashed)` and `Block broadcast_0 does not exist` after its summary (five runs of
five here). Why: the worker warm-up read (`runtime/warmup.py`, a background Spark job started
with the session) was still running when `srt run` stopped the session, and Spark's stop cut
its tasks off. Now the read runs in its own job group and `warmup.settle` (called before the
session stops, by `srt run` and at the process's exit) cancels it and waits until its tasks
have ended. Trials: `tests/runtime/test_warmup.py` (a session stopped while the warm-up's
tasks run: no error line; it fails without `settle`);
two nothing-to-do runs of the UPI job after the fix: nothing after the summary, nothing in the
job's log.

## Appends to the event log: exactly once across failures

Tried: `srt log append` of 50,008 lines onto a topic on a 4 MB full disk ended in a raw
traceback (exit 1, chained to a second one from closing the store); the store held the 35,000
lines of the batches acknowledged before the failure, nobody said which, and the natural retry
of the same command appended everything again (the issue's report: once every record had gone in
and the exit status was still 1, the retry appended all 50,008 a second time). A blank line was
skipped silently, although the decoder's table above dead-letters an empty record. Now
(`stateful_runtime/connectors/eventlog/ingest.py`) every input has a producer id —
`--producer-id`, by default the input file's identity (device, inode, read position, first
line), so the natural retry is idempotent; a pipe has none and is told so — and its line number
is the sequence, stored in the same RocksDB write batch as the records (Kafka's idempotent
producer); a retry skips the lines at or before it. A refused write (full disk, I/O error:
`LogWriteError` from the store, whose close is then quiet) ends the command with exit 2 and
`AppendIncompleteError`: which lines are in, the line the retry resumes from, what to do (free
space, run the same command again); `--json` prints the counts (`lines_read`, `appended`,
`skipped`, `dead_lettered`, `refused`, `resume_line`). `srt log serve` takes `@producer ID
[FIRST_LINE]` as a connection's first line: a reconnecting client resends and nothing is
doubled; a gap is refused. Blank lines are dead-lettered as documented (appended as empty
records, which the job's decoder dead-letters as "empty record"), not skipped: every line sent
is accounted for, and line numbers stay the sender's. Trials:
`tests/connectors/eventlog/test_ingest.py` — a real 2 MB tmpfs filled by 40,000 lines through
`srt log append`: exit 2, no traceback, the message's "Lines 1-N" equal to the records in the
topic, a retry on the still-full disk adds nothing, after the disk grows the same command
appends exactly the rest (each line once); Hypothesis: 60 inputs per run (good, blank,
malformed, over-long lines; batch sizes 1-7) each through up to 6 failed attempts (the store
refusing a batch, or taking it without the writer hearing back) and a final retry: the topic
holds each line exactly once, in order per partition, after every failure a prefix of the input
at least up to its resume line, and one more retry appends nothing; `srt log append` killed with
SIGKILL part-way through a piped input (two batches in), then the same input with the same
`--producer-id`: the rest appended, each line once; a close failing after every line went in
(the issue's exit-1 case): exit 2 saying every line is in, and the retry appends nothing; `srt
log serve` with a producer reconnecting and resending (from the start, from a later line, with a
gap). The CLI and serve tests fail on the previous code (traceback and exit 1; duplicates;
`@producer` appended as a record); the property test fails when the stored sequence is not
honoured.

## Checkpoint directories: nothing moved or deleted that the runtime does not own

Every move and delete of a checkpoint directory or of anything in it (a restore moving the
previous checkpoint aside, the fallback moving damaged files to `_quarantine/`, a claim writing
the marker) first passes one check, `CheckpointLayout.check_owned` in
`stateful_runtime/checkpoints/layout.py`: the directory is not the working directory, a home
directory (this user's or any account's) or `/`, nor a parent of one of them, and it holds
nothing the runtime did not create (its marker, lock, rewind, quarantine, dead letters, Spark's
query checkpoints). A restore moves an existing directory aside only if it carries the
`_job.json` marker. Savepoint retention and `srt savepoint dispose` delete only directories
holding a manifest or a writer record of the runtime (unchanged, already so).

Trials (each a test that fails without the check):

* `srt run … --set checkpoint.dir=. --from-savepoint ID` in a workspace (event log, DuckDB
  file, a notes file). Before: the whole working directory moved aside, the job ran from an
  empty checkpoint. Now: refused before anything is written ("is the working directory", what
  to set instead); every file in place.
* The same without `--from-savepoint`. Before: `_job.json` and Spark's checkpoint written among
  the user's files. Now: refused, nothing written.
* `checkpoint.dir` = `$HOME`, `/`, the parent of the working directory. Before: claimed. Now:
  refused, nothing written.
* A checkpoint directory holding files the runtime did not create, with or without a marker
  (Hypothesis: 60 random mixes of the runtime's entries and other names). Before: claimed, and
  moved aside whole by a restore. Now: refused iff anything foreign is there; nothing changed.
* A restore over a directory holding a Spark checkpoint but no marker. Before: moved aside.
  Now: refused ("not a job checkpoint").
* A restore over the job's own checkpoint: moved aside to `<dir>.before-restore-<time>`, as
  before, with the lock carried to the restored directory.

Tests: `tests/checkpoints/test_layout.py` (`-k "refused or restore or lock"`),
`tests/runtime/test_runner.py`
(`test_the_working_directory_as_checkpoint_dir_is_refused_and_nothing_moves`).
What remains: a directory the runtime created but an operator later filled by hand with files
named like the runtime's own (`_quarantine`, a query's name) is taken for the runtime's.

## One job, one process: the checkpoint lock

`srt run` takes an exclusive `flock` on `<checkpoint.dir>/_lock` (`CheckpointLayout.lock`)
before it writes anything, and holds it until the run ends (the kernel drops it when the
process dies, `kill -9` included). The holder writes its pid, run id and start time into the
file, then registers itself in the registry as STARTING, so `srt stop` finds it from its first
moment. A second `srt run` of the job — in any state of the first, STARTING included — is
refused with `JobLockedError` naming the holder (pid, run id, since, registry state), writes
nothing and leaves the registry entry alone. A restore swaps in the restored directory with the
lock already taken on it (`CheckpointLock.follow`), and a locker checks the file it locked is
still the one at the path, so two processes never both hold it. The registry check also refuses
a second live process under the same job name on another checkpoint directory.

Trials:

* A second `srt run` while the first is STARTING (held before its source check), then `srt
  stop`. Before: the second took over the registry entry, `srt stop` stopped the second and
  the first kept running. Now: refused, naming the first's pid and run id; the entry is still
  the first's; `srt stop` stops the first.
* Two lockers on one directory: the second is refused with the first's pid, run id and start
  time; the lock file is unchanged.
* A restore under the lock, then another locker: refused by the lock on the restored
  directory; the moved-aside directory's lock is free.
* A second `srt run --available-now` while the first is RUNNING: refused naming the first's
  pid and "state RUNNING" (before: refused too, but only at registration, after the restore,
  claim and fallback had written); after `kill -9` of the first's process group the kernel has
  dropped the lock and the next run completes (exit 0).

Tests: `tests/checkpoints/test_layout.py` (`-k lock`), `tests/runtime/test_runner.py`
(`test_a_second_run_of_a_starting_job_is_refused_and_stop_reaches_the_first`,
`test_a_running_job_refuses_a_second_run_and_its_kill_frees_the_checkpoint`).
What remains: two hosts sharing a checkpoint directory over a network filesystem get the
filesystem's `flock` semantics (NFS: emulated with POSIX locks); the lock is as strong as that.

## Savepoint manifests: no field trusted over the files

Found: a savepoint whose manifest `batch` was set back restored with exit 0 and the payments of
the batches after it gone — the sinks were rewound to the manifest's batch while Spark resumed
after the checkpoint files' real one. The class: every field of a manifest (savepoints and
mirror snapshots share it) is either read from the checksummed files at restore, or checked
against them, or covered by the manifest's own checksum (`manifest_sha256`, sha256 over every
other field, written by `new_manifest`); a mismatch is a `ManifestMismatchError` naming the
field, what the manifest says and what the files say (`checkpoints/manifest.py`, `check`):

| field | checked against |
|---|---|
| `queries.<q>.batch` | the newest `commits/N` among the savepoint's files (and the restore rewinds the sinks to the restored checkpoint's last commit, never to the manifest's number) |
| `watermark_ms`, `offsets` | `offsets/N`'s batch metadata and source lines |
| `pending_batch` | `offsets/N+1` present |
| `state_partitions` | Spark's `spark.sql.shuffle.partitions` in `offsets/N`, and every operator's partition directories `0..n-1` |
| `fingerprint` | its shape; its job is the manifest's `job`; its queries are the manifest's; a query whose fingerprint names operators has state files |
| `files` | each listed file present with its size (`check`), its sha256 (the logs at `check`, every file as a restore copies it); the files a restart at batch N reads (`QueryLayout.batch_files` on the laid-out copy) are exactly the listed ones; a savepoint directory holds no file the list lacks |
| `format_version`, `kind`, `created_at` | the formats and kinds this runtime writes; `created_at` is `created_at_epoch` |
| `id`, `job`, `spark_version`, `restored_from`, `checkpoint_dir`, times | the manifest's checksum (the id shown is the directory's name) |

`srt run --from-savepoint` / `--restore-from` refuse before anything is laid out or rewound;
`srt savepoint check` refuses (exit 2, JSON error with `mismatches`); `srt savepoint describe`
prints `manifest_mismatches` with the rest and exits 2; `srt savepoint list` and retention leave
out a manifest whose checksum fails (one bad manifest never hides the others); the mirror
uploads everything again rather than believe an edited manifest.

Trials (`tests/checkpoints/test_manifest.py`, one real UPI savepoint of 5 batches per module):
the reported case (batch set back to 0, checksum recomputed) is refused by `srt run
--from-savepoint` naming `queries.upi-counts.batch: the manifest says 0, the files say 4`, and
the sink table stays equal to the oracle; without the checksum recomputed the checksum names it
too. Hypothesis edits one field of the manifest at a time (any field, nested ones included;
replaced by an arbitrary JSON value, nudged by one, or deleted; checksum left or recomputed):
every edit is refused with a savepoint error and nothing laid out, or restores byte for byte the
checkpoint the unedited manifest restores (same batches and partitions). 150 examples per CI
run; 2,000 once by hand: 0 failures. Finding it made: an entry of a partition's `_metadata`
dropped from the list, checksum recomputed, restored without that file (Spark finds such files
by listing, so the restart-needs comparison alone missed it) — now refused by the directory
listing. Every single-field nudge (a number +1, a string's last character changed) or deletion
of every field, enumerated once by hand with the checksum recomputed: 164 of 173 refused; the 9
that restore the same checkpoint are `id`, `spark_version`, `queries.<q>.checkpoint_dir`,
`fingerprint.queries.<q>.path` (nudged or deleted) and `restored_from` deleted — none is read by
a restore. With the checksum left as written, every one of them is refused.

Limits: the checksum is not a signature. Whoever rewrites a manifest on purpose and recomputes
it is still caught wherever the files contradict a field, not for the fields only the checksum
covers (job name, fingerprint details the compatibility check does not read). A manifest
written before the checksum has none and is checked against its files only. In a mirror
location (which holds several batches' files) a file dropped from the list with the checksum
recomputed is caught only where a restart names it.

## Signals: SIGINT and SIGTERM

Tried on a running UPI job: Ctrl-C (SIGINT) and SIGTERM to the process group (what `timeout`,
systemd and Kubernetes send; `srt stop`'s fallback too) ended in tracebacks — the JVM, in the
same group, ran its shutdown hooks on SIGTERM and stopped the SparkContext under the queries
(Py4J "Cannot call methods on a stopped SparkContext", a `StackOverflowError`), and before
the runner's handlers were set (loading the job file, checking the checkpoint) or after
PySpark's context had replaced them, SIGINT raised `KeyboardInterrupt` — with exit 1 or 130
and a FAILED registry entry that the Dagster sensor took for a crash to restart. A stop that
did get through waited for an idle trigger, so with a backlog it read all of it first. Now
(`stateful_runtime/runtime/stop_signals.py`, `runner.py`, `session.py`): `srt run` catches
both signals from its first step; before Spark starts the first unwinds the step in progress
(loading the job file, a source check that waits: a `srt stop` of a job stuck there reaches
it), after that a handler only records it; the JVM is started
ignoring SIGINT and SIGTERM (the driver ends it once the queries stopped; SIGKILL and the
driver's death still end it) and PySpark's SIGINT handler is taken back; a signal before Spark
is up starts nothing more, one while the queries run stops them as `srt stop` does (the batch
in flight commits, not the backlog behind it), a second one during the stop abandons the batch
in flight (replayed on restart). Exit 0, no traceback, the registry STOPPED with `stopped_by`
(`SIGINT`/`SIGTERM`; a launcher's STARTING entry too), which the sensor reads as a stop.
Trials: `tests/runtime/test_runner_signals.py` (real `srt run` processes, 90,000 UPI events,
one bad in 9,973: SIGINT to a launched job's group while its file loads, then six runs —
SIGTERM to the group while loading, SIGINT to the pid and SIGTERM to the group once
registered before Spark is up, SIGTERM to the pid with a batch in flight, SIGTERM and SIGINT
to the group with a batch in flight and again during the stop — each exit 0 with no
traceback, STOPPED by that signal, at most 2 batches after the signal; then
`--available-now`: the table equals the oracle, each dead letter published once; it fails on
the previous runner at its first trial), `tests/runtime/test_session.py` (the JVM's ignored
signals, read from `/proc`), `tests/runtime/test_stop_signals.py`,
`tests/dagster_defs/test_restart_policy.py` (a STOPPED entry stopped by a signal is left
alone).

## Sink tables changed behind the job's back

Tried on the UPI job stopped after its commits: the DuckDB table truncated, the table dropped,
the DuckDB file deleted. Each time the job resumed with exit 0 and no warning, and the windows
closed before the stop were gone for good; a checkpoint deleted under a table that holds later
batches made the new run skip those batch ids as already written. Now
(`stateful_runtime/runtime/sink_check.py`, the warehouse sinks in `dbt_sink/`): each ledger
entry records the table's rows after its batch, in the batch's own transaction or commit
(PostgreSQL: the previous entry's plus the keys the batch inserted; ClickHouse: `count() FINAL`;
Delta: the files' `num_records` at the sink's commit); before the job starts each warehouse
sink's table is compared with the checkpoint, and a table gone, a ledger without the
checkpoint's last batch, fewer rows than recorded, or a ledger ahead of the checkpoint refuses
with `SinkDataLostError` (exit 2; the registry's `error`), naming what was found and three
commands back: `srt run --replay-sinks` (a fresh table from the source's retained records, the
checkpoint and the old table kept), the same with `--from-savepoint`, `srt sink accept` (the
hole accepted, recorded in the ledger). Before each batch the sink checks again, so a table
dropped or emptied while the job runs stops the job instead of being recreated. A fresh job, a
restart, a crash between the sink's commit and Spark's, a restore over a table with later
batches and a sink added by an upgrade are not refused. Trials:
`tests/faults/test_sink_tables.py` (real `srt run`, 6,000 UPI events: DuckDB table truncated,
dropped, its ledger dropped, its file deleted, each refused with exit 2, the commands and the
registry's error; then `--replay-sinks` — the table equals the oracle, the old table and the old
checkpoint kept; PostgreSQL truncated, refused, replayed, equal to the oracle; `srt sink accept`
then a run that goes on, the decision in the ledger) and `tests/runtime/test_sink_check.py`
(DuckDB, PostgreSQL, ClickHouse 18.16 and Delta Lake: truncated, rows deleted, dropped, ledger
deleted — refused at start and before the next write, which writes nothing; the legitimate
cases pass; accept and set-aside). On the previous runtime the refusals are not there: every
one of these trials resumed with exit 0.

## Poison records: aggregates past int64 and values a sink cannot store

Tried on the UPI job: two valid payments with `amount_paise` = 9223372036854775807 made the
native `SUM(BIGINT)` fail with `ARITHMETIC_OVERFLOW` on every run — nothing committed, the
stream blocked, a JVM stack that named neither the record nor a way out; on the window
operator the same sum failed converting to the `bigint` column. Now (`aggregates.py`,
`planner.py`, `dbt_sink/limits.py`, `runtime/failures.py`): an integral `Sum` accumulates and
is written as `decimal(38,0)` on both paths, an integral `Avg` sums exactly; every sink stores
it (DuckDB `DECIMAL(38,0)`, PostgreSQL `numeric`, ClickHouse `Decimal(38, 0)`, Delta, JSON
integers for Kafka and the event log); a checkpoint of the old bigint sums is refused at start
by name with both ways on; a table whose column is narrower than the job's output is checked
row by row before the write and a value it cannot hold stops the job naming the table, the
row's key, the value and the column's type; an overflow inside Spark's own aggregation stops
it naming the step, the batch's offsets and the ways on, Spark's stack in the log file only.
Trials (`tests/faults/test_overflow.py`, real `srt run`, each failing on the previous main):
the issue's corpus (two payments of 2^63-1 among 60 good ones, three of -2^63) into DuckDB,
PostgreSQL, ClickHouse and Delta at once on the native path and into DuckDB on the window
operator — every window's sum exact, compared as integers (M1's first minute
18446744073709554204); a checkpoint of bigint sums restarted by the wide code — refused naming
the state, the checkpoint untouched, and runs on with `wide=False`; DuckDB and PostgreSQL
tables of `BIGINT` sums — the batch with the sum past int64 stops naming the row, and the
same command commits every window exactly once the column is widened; a `wide=False` sum past
int64 — one message with the step, `ARITHMETIC_OVERFLOW`, the batch's offsets per partition and
`srt run --skip`, no stack. Properties (Hypothesis): any list of int64 values sums to Python's
exact sum on the Python path and in Spark (`tests/test_aggregates.py`); any number or string
against any column type is flagged exactly when it does not fit (`tests/dbt_sink/test_limits.py`,
with real DuckDB, PostgreSQL, ClickHouse and Delta tables); any `decimal(38,0)` column is
written to JSON as the exact integer (`tests/connectors/formats/test_json_properties.py`).

A value the sink cannot store in a query whose sink rows are source records (source, filters,
maps, sink) stopped the job too, naming the table and key but not the record, because the
records' origin was dropped before the sink. Now (`runtime/dataframes.py`,
`runtime/batch_writes.py`, `dbt_sink/limits.py`) such a query keeps each row's source
partition and offset to the sink's writer, which asks the sink for the rows its table cannot
store before the write (a narrower column; a NUL in a PostgreSQL string; a time outside
ClickHouse's `DateTime`, `DateTime64` or `Date`) and dead-letters them as a step's failed
records are — the sink as the step, the reason (table, column, value, type), the origin;
staged before the sink's transaction, published after the batch commits — while the rest of
the batch is written; `errors.policy=fail` stops naming the record and `srt run --skip`.
Trials (`tests/faults/test_sink_values.py`, real `srt run`): 60 payments copied by a `map`
into DuckDB, PostgreSQL, ClickHouse 18.16 and Delta (a run each), each table made narrower by hand
(`INTEGER`/`Int32`/`int32` amounts, `varchar(8)`, `FixedString(8)`, `DateTime`), with an
amount of 2^40, a 12-character note, a note holding a NUL, a payment time in 1960 and a row
failing two columns: each warehouse's dead letters are exactly the rows its table cannot take
(2, 4, 4 and 2), each once with its origin, every other row in its table, a second run adding
nothing; under `errors.policy=fail` the job stopped naming the record and its `--skip`, which
then passed it once. Properties: a NUL string and a time at ClickHouse's edges are flagged
exactly (`tests/dbt_sink/test_limits.py`). A window's row still stops the job by name: it
stands for many records, none of which alone is to blame.

A record too large for the Kafka sink's topic failed its batch on every replay: librdkafka
refuses one past the producer's `message.max.bytes` locally, the broker one past the topic's
`max.message.bytes`; and a topic whose `max.message.bytes` is below librdkafka's `batch.size`
refused every batch of records that each fit, batched together. Now (`connectors/kafka/sink.py`)
each record's size is computed as Kafka counts it (key, value, headers, framing at its largest,
plus the record batch's header against the topic's limit, read once with DescribeConfigs) and a
too-large record is one the sink cannot store: dead-lettered from a stateless query, a window's
row stops the job naming the topic, key, size, limit and setting; the producers' `batch.size`
stays within the topic's limit; a refusal not foreseen is a named `SinkError`. Trials: 30
payments copied by a `map` into a Kafka topic of `max.message.bytes` 4000, one with a
5,000-character note (`tests/faults/test_sink_values.py`, real `srt run`) — that one
dead-lettered with its origin, its size and the limit, the other 29 in the topic
(read_committed), a second run adding nothing. Properties (Hypothesis, real broker,
`tests/connectors/kafka/test_kafka_sink.py`): librdkafka refuses a record past
`message.max.bytes` exactly when the computed size says so (keys, UTF-8 header names, values at
the line); every record the count puts within the topic's limit is appended by the broker.

## Event time: implausible times and a poisoned watermark

Tried on the UPI job: one event stamped in the year 2100 moved the watermark to 2099; 8,003 of
the next 20,002 events were counted late and dropped, and because the watermark is in the
checkpoint every event after a restart was dropped too. An event with a negative timestamp was
accepted. Now each source has an event-time policy (`EventTimePolicy`, on its
`WatermarkStrategy`; `event_time.*` keys): a floor (default the epoch), a bound ahead of the
batch's processing time (default 1 hour) and one ahead of the watermark (default off). The
driver reads the batch's processing time and watermark from Spark's offset log when it plans
the batch's splits (a re-run reads the same entry), and the decoder dead-letters a record
outside, on both its paths, with the field, the value as a time and the bound in the reason;
it never reaches `withWatermark`. `srt checkpoint rewind JOB_FILE` brings back a checkpoint
poisoned before (or under a bound set too wide): it finds the first batch whose logged
watermark lies beyond the policy, moves that batch's commit and every later batch's files to
the checkpoint's quarantine (never deletes), and records the rewind the sinks owe; the next run
re-runs the batch that read the record from the previous batch's state with its logged offsets
and plans the rest again. Trials: `tests/faults/test_event_time.py` — a year-2100 and a
pre-1970 record among 20,000 payments: both in the dead-letter topic with their reasons, no
logged watermark beyond the good records', 0 late, the table equal to the oracle; a checkpoint
made with the policy off (over 1,000 payments dropped as late): after `srt checkpoint rewind`
and a run, 0 late, the replay reading only the batches from the poisoned one on (the state
kept), each dead letter in the topic once — the year-2100 and the pre-1970 record although
the topic's mark for their partition lay past them (a malformed record published later), the
malformed one not twice (without the rewind's note the two were missing) — every window equal
to the oracle and the closed ones to `srt reconcile`. `tests/connectors/test_event_time.py` (Hypothesis: 200 bounds
and event-time lists per run: any time outside a bound refused with it, any inside kept, the
fast and per-record paths agreeing record for record; seconds, timestamp strings and doubles
judged alike; a batch planned two days ago judged by its logged processing time, not the
clock) and `tests/faults/test_input_classes.py` (a pre-1970 and a year-2100 record: dead
letters). The year-2100 window row the poisoned run wrote stays in the sink table (a sink's
rewind forgets batches, not rows; see docs/guarantees.md).

## Poison records in steps: isolated, dead-lettered, or stopped with the way past

Tried on main before this change: a `map` that raised for one record value, or a keyed
process function that raised for one key, failed its task; Spark retried it, the micro-batch
failed, and every restart replayed the same batch into the same exception — nothing after the
record ever committed, and the message named the step and the record but no way past it. A
process function that changed its state before it raised would have kept the half-applied
change had anything caught the exception. Now (`stateful_runtime/operators/isolation.py`,
`operators/keyed.py`, `operators/maps.py`, `connectors/dead_letters.py`, `runtime/skips.py`):
every record carries its source partition and offset through the steps; a user call that
raises (`map`, `flat_map`, `process_element`, `on_timer`, the window operator's reduce,
aggregate and window functions), or whose output the step cannot hold, is isolated — its
state writes, timers and outputs are held aside until it returns and dropped when it raises (a
value read from state is the call's own copy), and the record goes to the source's
dead-letter topic with the step (`step` header), the reason (step, exception type and message,
the two innermost frames) and its origin, staged by the task per batch and partition and
published by the job process after the batch commits, with a mark per step and source
partition in the same write as the records. `errors.policy=fail`, or a step that rejects
`errors.max_consecutive` (100) records in a row or more than `errors.max_fraction` (0.1) of a
task's records, stops the job instead, naming the record's source, partition and offset and
`srt run JOB_FILE --skip SOURCE:PARTITION:OFFSET`, which records the skip in the checkpoint (as
soon as the run takes it, carried over by a restore) and dead-letters that record ("skipped by
operator") before any step sees it.

| trial | runs | result |
|---|---|---|
| `map` raising on 5 of 300 records, process function raising on 3 of a merchant's elements after changing its value and map state (`tests/operators/test_isolation_job.py`) | 1 | every other record's output committed; the DLQ holds exactly the 8, each once, with step and reason; the merchant's total and id count are those of its good records; `input 300 = output 292 + dead letters 8 + late 0` |
| kill -9 of the process group between the batch's commit and the publication | 1 | nothing published before the kill; after a restart each of the 9 once |
| kill -9 between the publication and removing the staged files | 1 | each of the 9 once |
| `errors.policy=fail`, two failing records, then `--skip` as the error says | 3 runs + 1 | each failed run named the record and the command; after the second skip the job finished: the 2 in the DLQ once (reason "skipped by operator"), the other 98 in the output; a further run published nothing again |
| a query failing between the monitor's look for a failed query and its look for an active one (`tests/runtime/test_runner.py`: the first look answered as a moment before the end, on a real query failing under `errors.policy=fail`) | 1 | exit 1 naming the record and its `--skip`, nothing committed. Before: exit 0 with the batch uncommitted (at load ~50 the skip loop above so ended early once in 9 runs, and its next run met the record) |
| `--skip` against the runs that follow (`tests/runtime/test_skips.py`, Hypothesis: runs giving skips, writers killed before their rename; `tests/runtime/test_runner.py`: a start refused after it took the checkpoint, then `--replay-sinks`; a real run with `--skip`, its savepoint, a restore) | 60 examples + 2 | every skip given stays recorded, rewritten only when one is new; the refused start kept its skip, the fresh checkpoint holds both, the restored one the run's. Before: a start refused by recovery, a sink or a source check had not recorded it; a restore or `--replay-sinks` left the skips in the old directory |
| step dead letters against crashes and re-planned batches (`tests/connectors/test_dead_letters.py`, Hypothesis: batches, kills before the commit, crashes after publishing, restores to older batches with other caps) | 60 examples + 2 pinned | each rejected record of every committed range once; fails with the range filter or the mark removed |
| a keyed call that raised vs. the same function never given those elements (`tests/operators/test_isolation.py`, Hypothesis: value, list, map and aggregating state changed in place, timers registered and deleted, main and side outputs; on the harness, the engine) | 40 examples | state, timers and outputs equal; fails with the rollback or the copy on read removed |
| the window operator's aggregate raising after changing its accumulator in place | 60 examples | window results = those of the good records; each failed record a dead letter |
| a process window function raising when its window fires (`tests/operators/test_window_harness.py`, Hypothesis over elements and poison values, on the harness (the engine); an aggregate's `get_result` raising; `errors.policy=fail`) | 25 examples + 2 | every element in exactly one emitted window or one dead letter (key, bounds, elements or accumulator, step, exception); no window state left; under `fail` the job stops with the window kept |
| the same on Spark (`tests/operators/test_window_spark.py`) | 2 runs | 200 payments, the windows holding a 13 dead-lettered whole with step `list-window`, every other closed window emitted, each payment in exactly one; a second run emits and dead-letters nothing again |

Limits: a failure inside Spark's own operators (a native aggregate, a sink's write) is not one
user call and is not isolated (`--skip` passes a record once it is identified); what a user
function does outside the runtime's API (a file, a service) is not undone; a user timer that
raised is consumed (its key's state stays; it does not fire again); a window whose function
raised when it fired is dead-lettered whole and released.

## Keyed state in the Python worker

The same faults against the runtime's keyed operators with their state in a RocksDB inside the
Python worker (`tests/faults/upi_keyed_job.py`: the UPI per-minute counts kept by a process
function in a MapState dropped by an event-time timer, or by the window operator with an
AggregateFunction and a trigger firing on every element, so the oracle and the checks above
apply unchanged):

| trial | runs | result |
|---|---|---|
| kill -9 of the job's process group at random points, torn newest `commits/N` included (`tests/faults/test_kill_trials.py -k local_state`, 3 a CI run for each operator; `python -m tests.faults.killtrials --keyed [--operator window] --trials N` for more) | 3 + 3 a run | every trial's table = the oracle of the records the sink's ledger claims; the drain = the oracle of the whole input, each dead letter once (the rows above, "keyed process function, state in the worker's RocksDB" and "window operator, state in the worker's RocksDB") |
| a Python worker killed (kill -9) in the middle of its task, after part of the batch's keys changed in its RocksDB and warm values (`tests/faults/test_python_worker_kill.py`) | 1 | Spark runs the task again and the run ends with exit 0: table = oracle, 8 dead letters for 8 bad records. Before: a local master failed the query at the first task failure (exit 1, Spark's stack trace); it now retries a task 4 times as a cluster does, and a worker that dies on every attempt is named with the way on (`runtime/failures.py`) |
| a truncated keyed file of the newest version at start, in a real run (`tests/checkpoints/test_savepoints_spark.py`, the keyed-state test); damaged and missing keyed files of the version a restart needs (`tests/checkpoints/test_keyed.py`) | 1 | `srt run`'s check names the file ("not a readable Arrow file", "missing"), moves the newest batch aside and re-runs it from the version before: counts = oracle; damage to an older version is refused through the same check as Spark's changelogs, naming the file and the newest savepoint |
| an executor killed (kill -9) mid-batch on the standalone cluster, then the driver, the checkpoint on S3 (`tests/faults/test_cluster_kills.py[keyed]`) | 1 | the new executor rebuilds each partition's store from the checkpoint's keyed files on S3, the restarted job goes on from the checkpoint; table = oracle, each dead letter once |
| kill -9 of jobs of several streams at random points (`tests/faults/test_connected_kill.py`): connected streams (`examples/payment_refunds.py`: state written by one input and read by the other, timers of both, a side output, a refund the function raises on), broadcast state (`examples/fraud_rules.py`: rules on every partition, a rule the function raises on), the temporal and interval joins (`examples/merchant_tiers.py`, three topics) | 2 kills per job a run | each drain = the oracle of its topics (matches and unmatched refunds; alerts; tiers as of each payment and refund pairs), each bad record one dead letter. Found on the way: a kill while Spark wrote a query's first `offsets/0` left its temporary file, and Spark 4.3 then refused every start (`STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY`); `srt run` now removes such unfinished writes of the batch logs first |

Every topic is written before the first run, so a kill may come after an input, or all of
them, was read to its end, and the drain may have nothing new to read: it must still fire what
each input's watermark passed before the kills (kept with every batch since these trials found
a drain ending with 61 payments held in the temporal join: NOTES.md, "Each input's watermark
across restarts").

## What the suite does not cover

* Kafka faults beyond those tried: one Apache Kafka node (KRaft) killed with SIGKILL and
  restarted, and on a three-node cluster a partition leader moved (controlled shutdown) and
  the sink's transaction coordinator killed (`tests/faults/test_kafka_outage.py`). A network
  partition between nodes and a whole cluster's loss are not tried.
* A killed Spark *worker* (not an executor) on the standalone cluster: nothing restarts the
  worker, and `platform/spark-cluster.sh start` restarts master and worker together.
* Damage deeper than the newest batch is refused, not repaired (restore from the savepoint
  or the mirror the error names); savepoints themselves are verified by checksum at restore.
"""


def load(directory: Path) -> list[dict[str, Any]]:
    runs = []
    for path in sorted(directory.glob("*.json")):
        try:
            runs.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return runs


def _table(rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(rows[0]) + " |", "|" + "|".join("---" for _ in rows[0]) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(out)


def render(runs: list[dict[str, Any]]) -> str:
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        for t in run.get("trials", []):
            by[(t["fault"], t["input"])].append({**t, "_run": run})
    # The input-class test's records get their own tables, not the faults table's rows.
    inputs = {k[1]: by.pop(k) for k in [k for k in by if k[0] == "input class"]}
    identity = [t for k in [k for k in by if k[0] == "accounting identity"] for t in by.pop(k)]
    rows = [
        [
            "fault",
            "input class",
            "trials",
            "exact",
            "failed",
            "lost",
            "duplicated",
            "from",
            "last trial",
        ]
    ]
    for (fault, inp), ts in sorted(by.items()):
        failed = [t for t in ts if t["result"] != "pass"]
        sources = sorted({t["_run"]["source"] for t in ts})
        last = (failed or ts)[-1]
        note = last.get("detail") or last.get("kill_point") or ""
        rows.append(
            [
                fault,
                inp,
                str(len(ts)),
                str(len(ts) - len(failed)),
                str(len(failed)),
                str(sum(t.get("lost") or 0 for t in ts)),
                str(sum(t.get("duplicated") or 0 for t in ts)),
                ", ".join(sources),
                note.replace("|", "/").replace("\n", " ")[:220],
            ]
        )
    kills = [t for ts in by.values() for t in ts if "kill_point" in t]
    points = {
        "during start-up or the first batch (k = 0)": sum(
            "after start" in t["kill_point"] for t in kills
        ),
        "with a batch in flight": sum(bool(t.get("in_flight")) for t in kills),
        "after the sink committed a batch Spark had not": sum(
            bool(t.get("sink_ahead")) for t in kills
        ),
        "followed by a torn commits/N": sum(bool(t.get("damage")) for t in kills),
    }
    run_rows = [["run", "source", "commit", "trials", "exact", "load average"]]
    for run in runs:
        ts = run.get("trials", [])
        run_rows.append(
            [
                run["run"],
                run["source"],
                run.get("commit", ""),
                str(len(ts)),
                str(sum(t["result"] == "pass" for t in ts)),
                f"{run.get('load_average', 0):.1f}",
            ]
        )
    input_rows = [["input class", "runs", "expected", "observed", "failed", "reason given"]]
    for name, ts in inputs.items():
        last = ts[-1]
        input_rows.append(
            [
                name,
                str(len(ts)),
                last["expected"],
                last["observed"],
                str(sum(t["result"] != "pass" for t in ts)),
                (last.get("detail") or "–").replace("|", "/")[:120],
            ]
        )
    identity_rows = [
        ["run", "commit", "input", "output", "dead letters", "late", "every counter = oracle"]
    ]
    for t in identity:
        identity_rows.append(
            [
                t["_run"]["run"],
                t["_run"].get("commit", "?"),
                *(f"{t['counts'][k]:,}" for k in ("input", "output", "dead_letters", "late")),
                "yes" if t["result"] == "pass" else "**no**",
            ]
        )
    return HEADER.format(
        inputs=_table(input_rows) if len(input_rows) > 1 else "(no run recorded yet)",
        identity=_table(identity_rows) if len(identity_rows) > 1 else "(no run recorded yet)",
        faults=_table(rows) if len(rows) > 1 else "(no trials recorded yet)",
        kill_total=len(kills),
        kill_points="; ".join(f"{k}: {v}" for k, v in points.items()),
        runs=_table(run_rows),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=Path, default=ARTIFACTS)
    p.add_argument("--out", type=Path, default=ROOT / "RELIABILITY.md")
    a = p.parse_args(argv)
    a.out.write_text(render(load(a.runs)))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
