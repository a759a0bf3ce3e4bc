"""The provider's metadata (provider.yaml's fields), read by Airflow's ProvidersManager
through the ``apache_airflow_provider`` entry point. Imports nothing."""

from __future__ import annotations

from typing import Any

INTEGRATION = "Stateful Runtime"

# The srt connection's fields, kept in its extra: (name, label, description).
CONN_FIELDS = (
    ("srt_home", "SRT_HOME", "The job registry directory (default ~/.srt)."),
    (
        "working_directory",
        "Working directory",
        "Where srt runs: the job files' location; relative paths in a job's config resolve here.",
    ),
    ("master", "Spark master", "Spark master URL of launched jobs (default local[*])."),
    ("srt_executable", "srt executable", "The srt command (default: the one beside Python)."),
    (
        "password_key",
        "Password is job key",
        "The job config key the connection's password fills (default sink.password).",
    ),
    (
        "env",
        "Environment (JSON)",
        'Extra environment of srt processes, e.g. {"SRT_S3_ENDPOINT_URL": "http://..."}.',
    ),
)


def get_provider_info() -> dict[str, Any]:
    """What the provider offers: hooks, operators, sensors, triggers and the ``srt``
    connection type (the fields of a provider.yaml)."""

    def modules(kind: str) -> list[dict[str, Any]]:
        return [{"integration-name": INTEGRATION, "python-modules": [f"srt_airflow.{kind}.srt"]}]

    return {
        "package-name": "stateful-runtime",
        "name": "Stateful Runtime",
        "description": "Manage stateful streaming jobs of the stateful runtime (Flink-style, "
        "on Spark Structured Streaming): launch, savepoints, upgrade and rescale, stop, "
        "health, and asset events on sink-table commits.",
        "versions": ["0.1.0"],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "external-doc-url": "https://github.com/stateful-runtime/stateful-runtime",
                "tags": ["software"],
            }
        ],
        "hooks": modules("hooks"),
        "operators": modules("operators"),
        "sensors": modules("sensors"),
        "triggers": modules("triggers"),
        "connection-types": [
            {
                "connection-type": "srt",
                "hook-class-name": "srt_airflow.hooks.srt.SrtHook",
                "hook-name": "Stateful Runtime (srt)",
                # The connection form (Airflow 3.2+ reads these declaratively).
                "ui-field-behaviour": {
                    "hidden-fields": ["host", "port", "schema", "login"],
                    "relabeling": {"password": "Secret job config value (see password_key)"},
                    "placeholders": {"password": "the value of the job key password_key names"},
                },
                "conn-fields": {
                    name: {"label": label, "schema": {"type": "string"}, "description": text}
                    for name, label, text in CONN_FIELDS
                },
            }
        ],
        "asset-uris": [{"schemes": ["srt"]}],
    }
