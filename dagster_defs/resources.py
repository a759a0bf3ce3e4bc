"""Dagster resources of the stateful runtime; nothing here touches Spark or the network."""

from __future__ import annotations

import os
from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field


class StreamingRuntime(ConfigurableResource):
    """Where the runtime keeps its job registry (the files ``srt status`` reads)."""

    home: str = Field(
        default_factory=lambda: os.environ.get("SRT_HOME", str(Path.home() / ".srt")),
        description="Job registry directory ($SRT_HOME, default ~/.srt).",
    )

    def jobs(self) -> list[dict]:
        """Registry entries of every job this runtime has run."""
        os.environ["SRT_HOME"] = self.home
        from stateful_runtime.runtime import registry

        return registry.entries()
