"""The operators' fixtures: the state backend a harness test runs on."""

from __future__ import annotations

import pytest

from stateful_runtime import testing


@pytest.fixture(params=testing.BACKENDS)
def harness_backend(request, monkeypatch) -> str:
    """Runs the test once per state backend (the harness's default is switched for it)."""
    monkeypatch.setattr(testing, "DEFAULT_BACKEND", request.param)
    return request.param
