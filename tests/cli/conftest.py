"""Fixtures for the command line: a runner and seeded databases."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from expstore import ReplayBuffer
from expstore.cli import app
from tests.helpers import make_rows

Invoke = Callable[..., Result]


@pytest.fixture
def invoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Invoke:
    """Run ``expstore ARGS`` in tmp_path, without EXPSTORE_URL from the environment, with
    tables as wide as when the output is not a terminal (100 columns), wherever the tests
    run (a pytest-xdist worker may have a terminal of another width)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.delenv("EXPSTORE_URL", raising=False)
    monkeypatch.delenv("EXPSTORE_DEBUG", raising=False)
    runner = CliRunner()

    def run(*args: str, **kwargs: object) -> Result:
        return runner.invoke(app, list(args), **kwargs)  # type: ignore[arg-type]

    return run


@pytest.fixture
def seeded(db_url: str, buffer_name: str) -> tuple[str, str]:
    """(url, buffer) holding 40 rows: 4 tasks of 10 steps, 2 agents, tensors in the state."""
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(make_rows(40, tensor=True))
    return db_url, buffer_name


@pytest.fixture
def sqlite_seeded(tmp_path: Path, buffer_name: str) -> tuple[str, str]:
    """Like ``seeded``, on SQLite only."""
    url = f"sqlite:///{tmp_path / 'seeded.db'}"
    with ReplayBuffer(url, name=buffer_name) as buffer:
        buffer.store_batch(make_rows(40, tensor=True))
    return url, buffer_name
