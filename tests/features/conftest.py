"""An empty buffer on each backend for the tests of expstore.features."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from expstore import ReplayBuffer


@pytest.fixture
def buf(db_url: str, buffer_name: str) -> Iterator[ReplayBuffer]:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        yield buffer
