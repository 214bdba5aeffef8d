"""Fixtures for the sources tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_api_client import PrometheusConnect


@pytest.fixture
def client_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The queries sent through prometheus-api-client's ``custom_query_range`` (which still runs)."""
    calls: list[str] = []
    original = PrometheusConnect.custom_query_range

    def spy(self: PrometheusConnect, query: str, *args: object, **kwargs: object) -> object:
        calls.append(query)
        return original(self, query, *args, **kwargs)

    monkeypatch.setattr(PrometheusConnect, "custom_query_range", spy)
    yield calls
