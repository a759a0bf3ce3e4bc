"""The runtime's control plane from another process: ``srt ... --json`` run as a child
process, its document returned, its failure raised as the runtime's own error.

One client for every orchestrator: Dagster's ``StreamingRuntime`` resource and Airflow's hook
and triggers run their commands through :class:`SrtClient` and raise their own error type
(``error``), built from the runtime's error document (:class:`~stateful_runtime.contract.
ErrorDocument`). Standard library only (the contract and secret masking): nothing heavy at a
Dagster definition load or an Airflow DAG parse. Secrets of a job's config reach ``srt`` in its
environment (``SRT_SECRET_SETS``, :mod:`stateful_runtime.masking`), never its argv; every
message built here is masked.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stateful_runtime.contract import ErrorDocument, ErrorKind
from stateful_runtime.exceptions import StatefulRuntimeError
from stateful_runtime.masking import child_env, mask_text, split_overrides

# How long a command that reads (status, list) may take; Python starts in ~0.3 s.
READ_TIMEOUT_S = 120.0

# What a client raises: ``error(message, kind=, details=, command=, returncode=)``.
ErrorFactory = Callable[..., Exception]


def runtime_error(message: str, **fields: Any) -> Exception:
    """The error of a client given no ``error``: the runtime's root error with the fields
    (``kind``, ``details``, ``command``, ``returncode``) as attributes."""
    error = StatefulRuntimeError(message)
    for name, value in fields.items():
        setattr(error, name, value)
    return error


def failed(
    error: ErrorFactory, what: str, command: Sequence[str], returncode: int, stderr: str
) -> Exception:
    """The error a failed ``srt ... --json`` reported, else a crash holding its stderr's tail
    (:meth:`ErrorDocument.of_process`), as ``error``."""
    doc = ErrorDocument.of_process(what, returncode, stderr)
    return error(
        doc.message,
        kind=doc.kind,
        details=doc.details,
        command=list(command),
        returncode=returncode,
    )


@dataclass(frozen=True)
class SrtClient:
    """Where ``srt`` runs and with what.

    Attributes:
        home: the job registry (``$SRT_HOME``), passed to every command as ``--home``.
        working_directory: where ``srt`` runs; job files and relative paths in a job's config
            resolve against it.
        master: Spark master URL for launched jobs (None: ``$SRT_SPARK_MASTER`` or local).
        executable: the ``srt`` command (None: the ``srt`` script beside this interpreter,
            else ``python -m stateful_runtime.cli``).
        env: extra environment of every ``srt`` process (S3 endpoint and credentials...).
        secrets: job config keys whose values are secret (``sink.password``...): given to
            ``srt`` through its environment only.
        error: what a failed command raises (the orchestrator's error type; its constructor
            takes the message and ``kind``, ``details``, ``command``, ``returncode``).
    """

    home: str
    working_directory: str
    master: str | None = None
    executable: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, str] = field(default_factory=dict)
    error: ErrorFactory = runtime_error

    def resolve(self, path: str | os.PathLike[str]) -> str:
        """``path`` made absolute against the working directory."""
        return str(Path(self.working_directory, path).resolve())

    def command(self, args: Sequence[str]) -> list[str]:
        """The full command line of ``srt ARGS`` against this registry."""
        if self.executable:
            base = [self.executable]
        else:
            script = Path(sys.executable).with_name("srt")
            base = (
                [str(script)] if script.exists() else [sys.executable, "-m", "stateful_runtime.cli"]
            )
        return [*base, "--home", self.home, *args]

    def environment(
        self, config: Mapping[str, Any] | None = None, extra: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """This process's environment (never changed) with the registry, the client's
        ``env``, ``extra``, and the secret values of ``config`` and of the client
        (``SRT_SECRET_SETS``)."""
        env = dict(os.environ)
        env["SRT_HOME"] = self.home
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.update(self.env)
        env.update(extra or {})
        hidden = split_overrides({**self.secrets, **(config or {})})[1]
        if hidden:
            env.update(child_env(hidden))
        return env

    def set_args(self, config: Mapping[str, Any] | None) -> list[str]:
        """``--set KEY=VALUE`` for the values of ``config`` that hold no secret."""
        public = split_overrides(dict(config or {}))[0]
        return [arg for k, v in public.items() for arg in ("--set", f"{k}={v}")]

    def run_json(
        self,
        args: Sequence[str],
        *,
        timeout: float,
        config: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Any:
        """Run ``srt ARGS --json`` and return its document; raise :attr:`error` with the
        runtime's own error if it failed (``config``: the job config whose secrets go in the
        environment; ``env``: more environment)."""
        command = self.command([*args, "--json"])
        what = f"srt {' '.join(args[:2])}"
        try:
            out = subprocess.run(
                command,
                cwd=self.working_directory,
                env=self.environment(config, env),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:
            raise self._timeout(what, timeout, command) from exc
        except OSError as exc:
            raise self._not_started(what, command, exc) from exc
        return self._document(what, command, out.returncode, out.stdout, out.stderr)

    async def arun_json(
        self,
        args: Sequence[str],
        *,
        timeout: float,
        config: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Any:
        """:meth:`run_json` for an event loop: the process is awaited, never waited on."""
        command = self.command([*args, "--json"])
        what = f"srt {' '.join(args[:2])}"
        try:
            proc = await asyncio.create_subprocess_exec(
                *command,
                cwd=self.working_directory,
                env=self.environment(config, env),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise self._not_started(what, command, exc) from exc
        try:
            stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError as exc:
            proc.kill()
            await proc.wait()
            raise self._timeout(what, timeout, command) from exc
        except asyncio.CancelledError:
            # The caller was cancelled (an Airflow trigger cleared or moved): leave no child.
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            raise
        assert proc.returncode is not None
        return self._document(
            what, command, proc.returncode, stdout.decode(errors="replace"), stderr.decode()
        )

    def to_json(self) -> dict[str, Any]:
        """The fields that place ``srt`` (no secrets, no environment)."""
        return {
            "home": self.home,
            "working_directory": self.working_directory,
            "master": self.master,
            "executable": self.executable,
        }

    # ------------------------------------------------------------------ errors

    def _document(
        self, what: str, command: list[str], returncode: int, stdout: str, stderr: str
    ) -> Any:
        if returncode != 0:
            raise failed(self.error, what, command, returncode, stderr)
        try:
            return json.loads(stdout)
        except ValueError as exc:
            raise self.error(
                f"{what} printed no JSON: {mask_text(stdout.strip()[-2000:])}",
                kind=ErrorKind.PROCESS_ERROR,
                command=command,
                returncode=returncode,
            ) from exc

    def _timeout(self, what: str, timeout: float, command: list[str]) -> Exception:
        return self.error(
            f"{what} did not finish within {timeout:.0f} s",
            kind=ErrorKind.TIMEOUT,
            command=command,
        )

    def _not_started(self, what: str, command: list[str], exc: OSError) -> Exception:
        return self.error(
            f"{what} could not start ({exc}): is the stateful runtime installed where this "
            f"runs? Point the client at it: the srt executable (Airflow: the srt connection's "
            f"'srt_executable'; Dagster: StreamingRuntime.srt_executable) or the "
            f"'working_directory'",
            kind=ErrorKind.PROCESS_ERROR,
            command=command,
        )
