"""Dagster plugin for the stateful runtime: streaming jobs as assets (``dagster dev -w workspace.yaml``)."""
