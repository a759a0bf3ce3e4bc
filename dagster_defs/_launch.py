"""From a job spec and the run's resources to a running ``srt run`` process."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dagster_defs._specs import StreamingJobSpec, config_error
from dagster_defs.resources import DuckDBWarehouse

_PLAN_JOB = re.compile(r"^job (\S+):", re.MULTILINE)


def launch_config(spec: StreamingJobSpec, resources: Any) -> dict[str, Any]:
    """The job's ``--set`` overrides: the spec's config plus values read from resources
    (``config_from_resources``), so the job writes where the resources say."""
    config = dict(spec.config)
    for key, ref in spec.config_from_resources.items():
        resource_key, attr = ref.split(".", 1)
        resource = getattr(resources, resource_key, None)
        if resource is None:
            raise config_error(
                f"job {spec.name!r}: config key {key!r} comes from resource "
                f"{resource_key!r}, which this run does not have"
            )
        if not hasattr(resource, attr):
            raise config_error(
                f"job {spec.name!r}: resource {resource_key!r} has no field "
                f"{attr!r} (config_from_resources[{key!r}])"
            )
        value = getattr(resource, attr)
        if value is None:
            raise config_error(
                f"job {spec.name!r}: {ref} is not set; configure the {resource_key!r} resource"
            )
        if isinstance(resource, DuckDBWarehouse) and attr == "path":
            # The job runs in the runtime's working directory; give it the file the checks read.
            value = str(resource.database())
        config[key] = value
    return config


def check_plan_job(plan: str, spec: StreamingJobSpec) -> None:
    """The job file must build the job the spec names: the registry is keyed by that name."""
    m = _PLAN_JOB.search(plan)
    if m and m.group(1) != spec.name:
        raise config_error(
            f"{spec.job_file} builds job {m.group(1)!r} but the spec names {spec.name!r}; "
            f"set StreamingJobSpec(name={m.group(1)!r}, ...)"
        )


def config_drift(entry: Mapping[str, Any], job_file: str, config: Mapping[str, Any]) -> list[str]:
    """Keys whose value in the live process differs from what the spec asks for."""
    from stateful_runtime.runtime.registry import redacted

    running = entry.get("config") or {}
    config = redacted(dict(config))  # the registry keeps secrets masked; compare likewise

    def same(a: Any, b: Any) -> bool:
        if str(a) == str(b):
            return True
        try:
            return float(a) == float(b)
        except (TypeError, ValueError):
            return False

    drift = [k for k, v in config.items() if k not in running or not same(running[k], v)]
    if entry.get("job_file") and str(entry["job_file"]) != str(job_file):
        drift.insert(0, "job_file")
    return drift
