"""From a job spec and the run's resources to the config of its ``srt run`` process."""

from __future__ import annotations

from typing import Any

from dagster_defs._specs import StreamingJobSpec, config_error
from dagster_defs.resources import DuckDBWarehouse


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
