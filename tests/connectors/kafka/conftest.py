"""The Kafka tests' broker (see helpers.py for which broker and why)."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from tests.connectors.kafka.helpers import Broker, start_broker


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    root = tmp_path_factory.mktemp("kafka")
    broker = start_broker(root / "data")
    yield broker
    # Its data goes with the session: no clean shutdown to wait for.
    broker.stop(signal.SIGKILL)
