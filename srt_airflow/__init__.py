"""Apache Airflow provider of the stateful runtime: manage streaming jobs from Airflow through
the control plane Dagster uses (``srt ... --json``, parsed with ``stateful_runtime.contract``).

Import what you use from its modules, as with any provider (nothing is imported here, so a
DAG file that imports one operator loads nothing else)::

    from srt_airflow.operators.srt import SrtLaunchJobOperator, SrtSavepointOperator
    from srt_airflow.sensors.srt import SrtCommittedSensor, SrtJobHealthySensor
    from srt_airflow.assets import sink_table_asset
"""

from srt_airflow.get_provider_info import get_provider_info

__all__ = ["get_provider_info"]
