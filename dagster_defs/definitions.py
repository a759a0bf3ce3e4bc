"""The Definitions ``workspace.yaml`` loads. Loading imports no Spark and opens nothing."""

from __future__ import annotations

from dagster import Definitions

from dagster_defs.resources import StreamingRuntime

defs = Definitions(resources={"streaming_runtime": StreamingRuntime()})
