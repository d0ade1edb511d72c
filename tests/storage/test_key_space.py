"""The key space (expstore.storage.key_space): a draw's probes seek an index on the
condition where there is one, and one draw's statements read one snapshot, on SQLite and
on Postgres. Draws over the key space are tested with their samplers
(tests/samplers/test_flat.py and each sampler's tests)."""

from __future__ import annotations

import numpy as np
import pytest

from expstore import ReplayBuffer
from expstore.query import QueryBuilder, condition_key
from expstore.samplers import PrioritizedSampler, UniformSampler
from tests.helpers import make_rows
from tests.samplers.stats import chi_square_p
from tests.samplers.test_flat import P_MIN, _draw, _gappy, _holds_no_index


def test_a_draw_reads_one_snapshot_whatever_is_written_meanwhile(
    buffer: ReplayBuffer, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The priority bounds and the probes of one prioritized draw agree even when another
    process lowers every priority in between: the weights (normalised by the smallest
    priority the bounds gave) never exceed 1."""
    from expstore.storage.key_space import SqlKeySpace as KeySpace

    buffer.store_batch(make_rows(40))
    ids = [r.id for r in buffer.query()]
    buffer.update_priorities(ids, [4.0] * len(ids))
    probe = KeySpace.probe
    lowered: list[bool] = []

    def probe_after_a_write(self: KeySpace, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        if not lowered:  # another process, between the bounds and the first probe
            with ReplayBuffer(db_url, name=buffer.storage.name) as other:
                other.update_priorities(ids, [0.01] * len(ids))
            lowered.append(True)
        return probe(self, *args, **kwargs)

    monkeypatch.setattr(KeySpace, "probe", probe_after_a_write)
    sampler = PrioritizedSampler(alpha=1.0, beta=1.0, seed=3)
    sampler.sample(buffer.storage, 16)
    assert lowered and _holds_no_index(buffer)  # the flat path ran, and probed
    np.testing.assert_allclose(sampler.last_weights, 1.0)  # every row at 4.0, as the bounds
    sampler.sample(buffer.storage, 16)  # the next draw sees the new priorities
    np.testing.assert_allclose(sampler.last_weights, 1.0)


def test_sqlite_probes_through_an_index_on_the_condition_where_the_planner_has_one(
    buffer: ReplayBuffer, db_url: str, buffer_name: str
) -> None:
    """A condition on an indexed column (or a path given an index) is probed by seeking
    that index with each candidate key; one without an index keeps the primary-key probe.
    Either way only the buffer's matching rows are drawn, uniformly."""
    if not db_url.startswith("sqlite"):
        pytest.skip("a SQLite planner choice (Postgres: see the next test)")
    _gappy(buffer, db_url, buffer_name)
    plans = buffer.sql.handle.plans
    by_agent = QueryBuilder().eq("exp_meta.agent_id", "agent1").build()
    by_path = QueryBuilder().eq("exp_data.state.url", "https://x/3").build()
    cases = [(by_agent, True), (by_path, False)]
    for condition, covered in cases:
        matching = np.array(buffer.storage.key_index(condition)["key"])
        buffer.storage.forget_caches()
        drawn = _draw(buffer, UniformSampler(seed=2), 120, 20, condition)
        assert _holds_no_index(buffer) and set(drawn.tolist()) <= set(matching.tolist())
        assert (
            chi_square_p(np.array([(drawn == k).sum() for k in matching]), np.ones(len(matching)))
            > P_MIN
        )
        # (plans are keyed by ("probe", (condition, max_staleness, consume_after), names))
        assert [v for k, v in plans.items() if condition_key(condition) == k[1][0]] == [covered]
    buffer.create_index("exp_data.state.url")
    buffer.sql.handle.plans.clear()
    drawn = _draw(buffer, UniformSampler(seed=3), 20, 20, by_path)
    assert set(plans.values()) == {True}
    assert set(drawn.tolist()) <= set(np.array(buffer.storage.key_index(by_path)["key"]).tolist())


def test_postgres_probes_a_condition_on_an_indexed_column_from_the_index_alone(
    own_pg_database: str,
) -> None:
    """On Postgres a filtered draw's probe of an indexed column reads its (buffer_id,
    column, key) index alone (an index-only scan), not each candidate's table row; the
    draw stays uniform over the matching rows only. (A database of its own: in one shared
    by every test, Postgres's statistics may well lead it to the primary key.)"""
    with ReplayBuffer(own_pg_database, name="probes") as buffer:
        buffer.store_batch(make_rows(4000, agents=10))
        handle = buffer.sql.handle
        engine = handle.connections.engine
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE expstore_rows")
        by_agent = QueryBuilder().eq("exp_meta.agent_id", "agent1").build()
        matching = np.array(buffer.storage.key_index(by_agent)["key"])
        buffer.storage.forget_caches()
        drawn = _draw(buffer, UniformSampler(seed=4), 40, 50, by_agent)
        assert _holds_no_index(buffer) and set(drawn.tolist()) <= set(matching.tolist())
        counts = np.array([(drawn == k).sum() for k in matching])
        assert chi_square_p(counts, np.ones(len(matching))) > P_MIN
        probes = [
            s for k, s in handle._statements.items() if k[0] == "probe" and k[-1] == "covering"
        ]
        assert len(probes) == 1
        chosen = np.sort(np.random.default_rng(0).choice(matching, 50)).tolist()
        with handle.read() as conn:
            plan = "\n".join(probes[0].plan(conn, keys=handle.dialect.key_set(chosen)))
    assert "Index Only Scan using ix_expstore_rows_buffer_id_agent_id_key" in plan, plan
