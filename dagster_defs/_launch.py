"""From a job spec and the run's resources to the config of its ``srt run`` process."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster_defs._specs import StreamingJobSpec, config_error
from dagster_defs._translator import StreamingJobTranslator
from dagster_defs.resources import DuckDBWarehouse, StreamingRuntime

# What the job process reads to push its commits to Dagster
# (stateful_runtime.runtime.dagster_push.URL_ENV / ASSETS_ENV).
PUSH_URL_ENV = "SRT_DAGSTER_URL"
PUSH_ASSETS_ENV = "SRT_DAGSTER_ASSETS"


def push_env(
    spec: StreamingJobSpec, translator: StreamingJobTranslator, runtime: StreamingRuntime
) -> dict[str, str]:
    """Environment of a launched job that makes it report each committed batch to Dagster's
    webserver as a materialisation of its sink tables' assets (empty: no ``dagster_url``, or
    no sink tables; an empty URL stops a job inheriting one from this process)."""
    import json

    if not runtime.dagster_url or not spec.sink_tables:
        return {PUSH_URL_ENV: ""}
    assets: dict[str, list[list[str]]] = {}
    for table in spec.sink_tables:
        assets.setdefault(table.query, []).append(
            list(translator.get_sink_asset_key(spec, table).path)
        )
    return {PUSH_URL_ENV: runtime.dagster_url, PUSH_ASSETS_ENV: json.dumps(assets)}


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
