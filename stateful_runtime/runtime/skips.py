"""Records an operator passes (``srt run JOB_FILE --skip SOURCE:PARTITION:OFFSET``).

A record that stops the job (a step cannot process it and cannot isolate it: the job's
``errors.policy`` is ``fail``, or the step's error bound tripped, or the failure is inside
Spark's own operators) is named in the job's error by its source, partition and offset. The
skip is recorded in the checkpoint directory (``_dead_letters/skips.json``) as soon as the
run has taken the directory, before anything can fail the run, and kept by every later run,
a restore or ``--replay-sinks`` (the runner carries the record into the new directory): a
batch replayed later, planned with whatever boundaries, skips it again. It is applied by a
step right after the source (:class:`~stateful_runtime.operators.isolation.SkipOperator`):
the record goes to the source's dead-letter topic with reason "skipped by operator", exactly
once (the step dead-letter protocol), and counts as a dead letter in the job's accounting.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from stateful_runtime.checkpoints.storage import write_file
from stateful_runtime.exceptions import ConfigError

Skip = tuple[str, int, int]
# How a stopped job's error names the record to skip (UserFunctionError: "--skip s:p:o").
_NAMED = re.compile(r"--skip ([A-Za-z0-9_.\-]+):(\d+):(\d+)")


def parse(text: str, sources: Sequence[str]) -> Skip:
    """``SOURCE:PARTITION:OFFSET`` as ``srt run --skip`` takes it, checked against the job's
    ``sources``."""
    source, _, rest = text.rpartition(":")
    source, _, partition = source.rpartition(":")
    if not (source and partition.isdigit() and rest.isdigit()):
        raise ConfigError(
            f"--skip {text!r}: give SOURCE:PARTITION:OFFSET, as the job's error names the "
            f"record (e.g. --skip {sources[0] if sources else 'payments'}:0:17)"
        )
    if source not in sources:
        raise ConfigError(
            f"--skip {text!r}: the job has no source {source!r}; its sources: "
            f"{', '.join(sources) or '(none)'}"
        )
    return source, int(partition), int(rest)


def load(path: Path) -> dict[str, set[tuple[int, int]]]:
    """The recorded skips per source."""
    try:
        listed = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{path} (the records `srt run --skip` passes) cannot be read: {exc}; fix or "
            f"delete it and give --skip again"
        ) from exc
    out: dict[str, set[tuple[int, int]]] = {}
    for source, partition, offset in listed:
        out.setdefault(str(source), set()).add((int(partition), int(offset)))
    return out


def listed(skips: Mapping[str, Iterable[tuple[int, int]]]) -> list[Skip]:
    """``skips`` per source as one sorted list of ``(source, partition, offset)``."""
    return sorted((s, p, o) for s, pairs in skips.items() for p, o in pairs)


def record(path: Path, new: Iterable[Skip]) -> dict[str, set[tuple[int, int]]]:
    """Add ``new`` to the skips recorded at ``path`` (atomically, and only if one is not there
    yet); every skip, per source."""
    skips = load(path)
    before = listed(skips)
    for source, partition, offset in new:
        skips.setdefault(source, set()).add((partition, offset))
    after = listed(skips)
    if after == before:
        return skips
    write_file(path, json.dumps([list(s) for s in after]), sync=True)
    return skips


def advice(reason: str, job_file: str) -> str | None:
    """The command that passes the record a failed query's ``reason`` names, if it names one."""
    found = _NAMED.search(reason)
    if found is None:
        return None
    source, partition, offset = found.groups()
    return (
        f"to pass record {source}:{partition}:{offset} (to the dead-letter topic, reason "
        f"'skipped by operator') and go on: srt run {job_file} --skip "
        f"{source}:{partition}:{offset}"
    )
