"""What the control endpoint (:mod:`.endpoint`) asks of a running job: the runner's answers."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from stateful_runtime.contract import JobHealth, SavepointSummary, StopReport
from stateful_runtime.runtime import registry
from stateful_runtime.runtime.endpoint import Handlers
from stateful_runtime.runtime.progress import checkpoint_facts

if TYPE_CHECKING:
    from stateful_runtime.runtime.runner import JobRunner


class RunnerHandlers(Handlers):
    """:class:`~.endpoint.Handlers` of a :class:`~.runner.JobRunner`."""

    def __init__(self, runner: JobRunner) -> None:
        self.runner = runner
        self.job = runner.job.name
        self.savepoint_roots = runner.job.checkpoint.savepoint_roots

    def health(self) -> JobHealth:
        """Each query's last report, with its checkpoint's last commit and age read now."""
        queries = {}
        for run in list(self.runner.runs):
            h = run.health
            queries[run.plan.name] = replace(
                h,
                checkpoint=checkpoint_facts(run.checkpoint_dir).committed(),
                records=h.records or run.records.counts(run.plan.source_names),
                dead_letters=self.runner.dead_letter_view(run.plan.name),
            )
        return JobHealth(self.job, os.getpid(), self.runner.state, time.time(), queries)

    def savepoint(self, target: str | None) -> SavepointSummary:
        summary = self.runner.take_savepoint(target, "savepoint")
        registry.update(self.job, last_savepoint=summary.ref().to_json())
        return summary

    def stop(self, savepoint: bool, target: str | None, timeout: float) -> StopReport:
        return self.runner.stop_and_wait(savepoint=savepoint, target=target, timeout=timeout)
