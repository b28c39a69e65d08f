"""Fixtures of the mock's own tests: a mock server in this process, with no latency, and a
plain httpx client for it. A test module that needs another configuration (batches, the
official SDK) defines its own `server` and `client`, which take precedence."""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest

from mockllm import MockConfig, MockServer


@pytest.fixture
def server() -> Iterator[MockServer]:
    with MockServer(MockConfig(latency_s=0)) as mock:
        yield mock


@pytest.fixture
def client(server: MockServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url or "", timeout=10) as http:
        yield http
