"""The sections after throughput: Kafka source, latency, scale-out, profiles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Rough seconds per section, for the progress bar's ETA only.
WEIGHT = {"kafka": 120.0, "latency": 240.0, "scaleout": 180.0, "profiles": 200.0}


def run(section: str, *, work: Path, cfg: dict[str, Any], seed: int, options: dict[str, Any],
        progress, results: dict[str, Any], save, keep: bool) -> None:
    progress.step(section, WEIGHT[section])
    results[section] = {"skipped": "not implemented yet"}
    save()
    progress.done(f"{section}: not implemented yet")
