"""platform/kafka-broker.sh, the broker the tests and a developer run: its stop signal works
whatever its caller ignores, and it formats with any cluster id Kafka makes."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tests.connectors.kafka.helpers import SCRIPT, Broker, _require_jars, _wait_ready
from tests.helpers import free_port


def test_a_broker_started_by_a_caller_ignoring_sigterm_still_stops_cleanly_on_it(
    tmp_path: Path,
):
    """A caller that ignores SIGTERM (a suite or a scheduler started in the background, whose
    ignored SIGINT a library mapped SIGTERM onto, as Dagster's interrupt handling does) passes
    it on to what it starts, and HotSpot keeps an inherited ignored SIGTERM ignored: the broker
    would outlive its stop until killed, with no clean shutdown.

    Its cluster id starts with '-', as one in 64 random ids does: the format's argument
    parser took such an id apart from its option for an option of its own."""
    _require_jars()
    port = free_port()
    with (tmp_path / "kafka.log").open("w") as log:
        process = subprocess.Popen(
            ["bash", str(SCRIPT), str(port), str(tmp_path / "data")],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "SRT_KAFKA_CLUSTER_ID": "-" + "A" * 21},
            preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN),
        )
    try:
        _wait_ready(Broker(f"127.0.0.1:{port}", process, tmp_path / "data"))
        process.send_signal(signal.SIGTERM)
        # A broker that ignored it would run on (TimeoutExpired); one that shut down through
        # its hooks exits as the JVM does after SIGTERM, 128 + 15.
        assert process.wait(120) == 143
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
