"""From a job spec and the run's resources to the config of its ``srt run`` process."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster_defs._specs import StreamingJobSpec, config_error
from dagster_defs.resources import DuckDBWarehouse


def launch_config(spec: StreamingJobSpec, resources: Any) -> dict[str, Any]:
    """The job's ``--set`` overrides: the spec's config plus values read from resources
    (``config_from_resources``), so the job writes where the resources say. A reference to a
    method returning a mapping (``{"sink.*": "warehouse.sink_config"}``) gives every key it
    returns."""
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
        if callable(value):  # e.g. warehouse.sink_config: every sink.* key of the resource
            value = value()
        if isinstance(value, Mapping):
            prefix = key[:-1] if key.endswith(".*") else None
            if prefix is None or not all(str(k).startswith(prefix) for k in value):
                raise config_error(
                    f"job {spec.name!r}: {ref} gives {sorted(value)}; bind it to a key "
                    f"pattern such as 'sink.*'"
                )
            config.update(value)
            continue
        if value is None:
            raise config_error(
                f"job {spec.name!r}: {ref} is not set; configure the {resource_key!r} resource"
            )
        if isinstance(resource, DuckDBWarehouse) and attr == "path":
            # The job runs in the runtime's working directory; give it the file the checks read.
            value = str(resource.database())
        config[key] = value
    return config
