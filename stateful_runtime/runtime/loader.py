"""Job files: import one, apply ``--set`` overrides to its ``DEFAULTS``, build the job.

``srt run JOB_FILE --set key=value`` overrides defaults; a key that is not in ``DEFAULTS`` (or
:data:`~stateful_runtime.job.RUNTIME_KEYS`) is an error, so a typo never silently runs with the
default.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stateful_runtime.exceptions import ConfigError
from stateful_runtime.job import (
    ROCKSDB_KEYS,
    RUNTIME_KEYS,
    ErrorPolicy,
    RocksDBMemory,
    StreamJob,
    check_number,
    is_event_time_key,
)


@dataclass(frozen=True)
class JobFile:
    path: Path
    defaults: Mapping[str, Any]
    config: Mapping[str, Any]
    job: StreamJob


def _coerce(key: str, raw: str, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if isinstance(default, int):
            value: Any = int(raw)
        elif isinstance(default, float):
            value = float(raw)
        else:
            return raw
    except ValueError:
        raise ConfigError(
            f"--set {key}={raw}: expected a {type(default).__name__} like the default {default!r}"
        ) from None
    try:
        return check_number(key, value)
    except ConfigError as exc:
        raise ConfigError(f"--set {exc}") from None


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set takes KEY=VALUE, got {pair!r}")
        out[key.strip()] = value
    return out


def load_job_file(path: str | Path, overrides: Mapping[str, str] | None = None) -> JobFile:
    """Import a job file, apply ``--set`` overrides to its DEFAULTS, and build the job."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"job file {path} not found; give the path of a Python job file")
    spec = importlib.util.spec_from_file_location(f"srt_job_{path.stem}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ConfigError(f"job file {path} failed to import: {type(exc).__name__}: {exc}") from exc
    # Functions and classes defined in the job file travel to Spark's workers by value: the
    # workers cannot import a module loaded from a file path.
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(module)
    build = getattr(module, "build", None)
    if not callable(build):
        raise ConfigError(f"job file {path} must define build(config) -> StreamJob")
    defaults: Mapping[str, Any] = {**RUNTIME_KEYS, **getattr(module, "DEFAULTS", {})}
    overrides = dict(overrides or {})
    # event_time.<source>.<setting>: the source is checked once the job is built.
    unknown = sorted(k for k in set(overrides) - set(defaults) if not is_event_time_key(k))
    if unknown:
        known = ", ".join(sorted(defaults)) or "(none: the job file declares no DEFAULTS)"
        raise ConfigError(f"unknown config key(s) {', '.join(unknown)}; known keys: {known}")
    config = dict(defaults)
    for key, raw in overrides.items():
        config[key] = _coerce(key, raw, defaults.get(key, ""))
    for key, value in config.items():  # the job file's own DEFAULTS, as strictly
        check_number(key, value)
    job = build(config)
    if not isinstance(job, StreamJob):
        raise ConfigError(f"{path}: build() returned {type(job).__name__}, not a StreamJob")
    job.apply_event_time_settings(config)
    if not job.sinks:
        raise ConfigError(f"job {job.name!r} has no sink: add .sink_to(...) to a stream")
    if any(config.get(k) not in (None, "") for k in RUNTIME_KEYS if k.startswith("errors.")):
        # a job built without from_config still takes the errors.* keys --set gives
        job.errors = ErrorPolicy.from_config(config, job.errors)
    if any(config.get(k) not in (None, "") for k in ROCKSDB_KEYS):  # the same for state.rocksdb.*
        job.rocksdb = RocksDBMemory.from_config(config, job.rocksdb)
    return JobFile(path.resolve(), defaults, config, job)
