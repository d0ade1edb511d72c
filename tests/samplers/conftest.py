from __future__ import annotations

from collections.abc import Iterator

import pytest

from expstore import ReplayBuffer


@pytest.fixture
def buffer(db_url: str, buffer_name: str) -> Iterator[ReplayBuffer]:
    """A buffer on each backend (a SQLite file, Postgres), private to the test."""
    with ReplayBuffer(db_url, name=buffer_name) as buf:
        yield buf
