"""The database's summary of a buffer (expstore.stats.summary) gives the same figures as
computing them from the rows' columns in numpy, on both backends."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from expstore import ReplayBuffer
from expstore.cli.stats import _from_index, compute_stats
from expstore.query import QueryBuilder
from tests.helpers import make_row


@pytest.fixture
def buffer(db_url: str, buffer_name: str) -> Iterator[ReplayBuffer]:
    with ReplayBuffer(db_url, name=buffer_name) as buf:
        yield buf


def _fill(buffer: ReplayBuffer) -> None:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(300):
        task = int(rng.integers(0, 40))
        reward = None if i % 7 == 0 else float(rng.normal(0, 3))
        version = None if i % 5 == 0 else int(rng.integers(0, 9))
        rows.append(
            make_row(
                f"task{task}",
                f"agent{task % 3}",
                int(rng.integers(0, 12)),  # repeated steps: ties go to the later row
                reward=reward,
                version=version,
                execute_time=1_700_000_000 + rng.random() * 1000,
            )
        )
    buffer.store_batch(rows)
    buffer.set_policy_version(10)


def _same(a: object, b: object) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys()
        for key in a:
            _same(a[key], b[key])
    elif isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-9)
    else:
        assert a == b


@pytest.mark.parametrize("where", [None, "agent1", "nobody"])
@pytest.mark.parametrize("success_above", [0.0, 2.5])
def test_the_database_summary_equals_numpy_over_the_rows(
    buffer: ReplayBuffer, where: str | None, success_above: float
) -> None:
    _fill(buffer)
    condition = None if where is None else QueryBuilder().eq("exp_meta.agent_id", where).build()
    by_sql = compute_stats(buffer, condition, success_above=success_above)
    by_numpy = _from_index(buffer, condition, None, success_above)
    _same(by_sql, by_numpy)
    if where != "nobody":
        assert by_sql["rows"] > 0 and by_sql["versions"]["staleness"]["count"] > 0


def test_an_empty_buffer_summarises_to_zeros(buffer: ReplayBuffer) -> None:
    _same(compute_stats(buffer), _from_index(buffer, None, None, 0.0))
