"""The provider's one door to the runtime: ``srt ... --json`` run as a child process, its
document parsed with :mod:`stateful_runtime.contract`.

No Airflow here: the hook runs these commands in a worker (:meth:`SrtClient.run_json`) and the
triggers in the triggerer's event loop (:meth:`SrtClient.arun_json`, which never blocks the
loop). Secrets of a job's config reach ``srt`` in its environment (``SRT_SECRET_SETS``,
:mod:`stateful_runtime.masking`), never its argv; every message this module builds is masked.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from srt_airflow.errors import SrtAirflowError, from_process
from stateful_runtime.contract import ErrorKind
from stateful_runtime.masking import child_env, mask_text, split_overrides

# How long a command that reads (status, list) may take; Python starts in ~0.3 s.
READ_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class SrtClient:
    """Where ``srt`` runs and with what: the fields of an ``srt`` connection.

    Attributes:
        home: the job registry (``$SRT_HOME``), passed to every command as ``--home``.
        working_directory: where ``srt`` runs; job files and relative paths in a job's config
            resolve against it (the job files' location).
        master: Spark master URL for launched jobs (None: ``$SRT_SPARK_MASTER`` or local).
        executable: the ``srt`` command (None: the ``srt`` script beside this interpreter,
            else ``python -m stateful_runtime.cli``).
        env: extra environment of every ``srt`` process (S3 endpoint and credentials...).
        secrets: job config keys whose values are secret (``sink.password``...): given to
            ``srt`` through its environment only.
    """

    home: str
    working_directory: str
    master: str | None = None
    executable: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, str] = field(default_factory=dict)

    def resolve(self, path: str | os.PathLike[str]) -> str:
        """``path`` made absolute against the working directory."""
        return str(Path(self.working_directory, path).resolve())

    def command(self, args: Sequence[str]) -> list[str]:
        """The full command line of ``srt ARGS --json`` against this registry."""
        if self.executable:
            base = [self.executable]
        else:
            script = Path(sys.executable).with_name("srt")
            base = (
                [str(script)] if script.exists() else [sys.executable, "-m", "stateful_runtime.cli"]
            )
        return [*base, "--home", self.home, *args, "--json"]

    def environment(self, config: Mapping[str, Any] | None = None) -> dict[str, str]:
        """This process's environment with the registry, the connection's ``env``, and the
        secret values of ``config`` and of the connection (``SRT_SECRET_SETS``)."""
        env = dict(os.environ)
        env["SRT_HOME"] = self.home
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.update(self.env)
        hidden = split_overrides({**self.secrets, **(config or {})})[1]
        env.update(child_env(hidden))
        return env

    def set_args(self, config: Mapping[str, Any] | None) -> list[str]:
        """``--set KEY=VALUE`` for the values of ``config`` that hold no secret."""
        public = split_overrides(dict(config or {}))[0]
        return [arg for k, v in public.items() for arg in ("--set", f"{k}={v}")]

    def run_json(
        self, args: Sequence[str], *, timeout: float, config: Mapping[str, Any] | None = None
    ) -> Any:
        """Run ``srt ARGS --json`` and return its document; raise :class:`SrtAirflowError`
        with the runtime's own error if it failed."""
        command = self.command(args)
        what = f"srt {' '.join(args[:2])}"
        try:
            out = subprocess.run(
                command,
                cwd=self.working_directory,
                env=self.environment(config),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:
            raise _timeout(what, timeout, command) from exc
        except OSError as exc:
            raise _not_started(what, command, exc) from exc
        return _document(what, command, out.returncode, out.stdout, out.stderr)

    async def arun_json(
        self, args: Sequence[str], *, timeout: float, config: Mapping[str, Any] | None = None
    ) -> Any:
        """:meth:`run_json` for an event loop: the process is awaited, never waited on."""
        command = self.command(args)
        what = f"srt {' '.join(args[:2])}"
        try:
            proc = await asyncio.create_subprocess_exec(
                *command,
                cwd=self.working_directory,
                env=self.environment(config),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise _not_started(what, command, exc) from exc
        try:
            stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError as exc:
            proc.kill()
            await proc.wait()
            raise _timeout(what, timeout, command) from exc
        except asyncio.CancelledError:
            # The trigger was cancelled (task cleared, triggerer moving it): leave no child.
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            raise
        assert proc.returncode is not None
        return _document(
            what, command, proc.returncode, stdout.decode(errors="replace"), stderr.decode()
        )

    def to_json(self) -> dict[str, Any]:
        """The fields that place ``srt`` (no secrets, no environment): what a trigger may
        carry without a connection (tests)."""
        return {
            "home": self.home,
            "working_directory": self.working_directory,
            "master": self.master,
            "executable": self.executable,
        }


def _document(what: str, command: list[str], returncode: int, stdout: str, stderr: str) -> Any:
    if returncode != 0:
        raise from_process(what, command, returncode, stderr)
    try:
        return json.loads(stdout)
    except ValueError as exc:
        raise SrtAirflowError(
            f"{what} printed no JSON: {mask_text(stdout.strip()[-2000:])}",
            kind=ErrorKind.PROCESS_ERROR,
            command=command,
            returncode=returncode,
        ) from exc


def _timeout(what: str, timeout: float, command: list[str]) -> SrtAirflowError:
    return SrtAirflowError(
        f"{what} did not finish within {timeout:.0f} s", kind=ErrorKind.TIMEOUT, command=command
    )


def _not_started(what: str, command: list[str], exc: OSError) -> SrtAirflowError:
    return SrtAirflowError(
        f"{what} could not start ({exc}): is the stateful runtime installed where the task "
        f"runs? Set the srt connection's 'srt_executable' or 'working_directory'",
        kind=ErrorKind.PROCESS_ERROR,
        command=command,
    )
