"""Draws with ``max_staleness`` over the key space look for rows from the first fresh row's
key on (expstore.policy_versions.first_fresh_key, KeySpace.low): exactly the fresh rows,
uniformly, on both backends, with probes in proportion to the batch when the stale rows
are the older ones, whatever their share."""

from __future__ import annotations

import numpy as np
import pytest

from expstore import EmptyBufferError, ReplayBuffer
from expstore import policy_versions as versions
from expstore.policy_versions import first_fresh_key
from expstore.query import QueryBuilder
from expstore.samplers import GroupSampler, RecencySampler, UniformSampler
from expstore.storage import Tuning
from tests.helpers import make_rows
from tests.samplers.stats import chi_square_p

P_MIN = 1e-4


def _store(buffer: ReplayBuffer, n: int, version: int | None, tasks: int = 4) -> None:
    rows = make_rows(n, tasks=tasks)
    for row in rows:
        row.exp_meta.policy_version = version
        row.exp_meta.task_id = f"v{version}-{row.exp_meta.task_id}"  # groups within a version
    buffer.store_batch(rows)


def _versions(buffer: ReplayBuffer, per_version: int, count: int) -> None:
    """``per_version`` rows of each version 0 .. count - 1, oldest first."""
    for version in range(count):
        _store(buffer, per_version, version)


def _fresh(buffer: ReplayBuffer, oldest: int) -> set[int]:
    cond = QueryBuilder().gte("exp_meta.policy_version", oldest).build()
    found = set(buffer.storage.key_index(cond)["key"].tolist())
    unversioned = QueryBuilder().is_null("exp_meta.policy_version").build()
    found |= set(buffer.storage.key_index(unversioned)["key"].tolist())
    buffer.storage.forget_caches()
    return found


def _first(buffer: ReplayBuffer, oldest: int) -> int | None:
    handle = buffer.sql.handle
    with handle.read() as conn:
        return first_fresh_key(handle, conn, oldest)


def _draw(buffer: ReplayBuffer, sampler, calls: int, batch: int) -> np.ndarray:
    drawn = []
    for _ in range(calls):
        sampler.sample(buffer.storage, batch)
        drawn.append(sampler.last_keys)
    return np.concatenate(drawn)


def test_the_first_fresh_key_is_the_smallest_key_of_a_fresh_row(buffer: ReplayBuffer) -> None:
    _versions(buffer, 5, 6)  # versions 0..5
    _store(buffer, 3, 1)  # a late row of an old version
    keys = buffer.storage.key_index(None)["key"]
    assert _first(buffer, 4) == keys[20]  # the first row of version 4
    assert _first(buffer, 0) == keys[0]
    assert _first(buffer, 6) is None  # nothing fresh
    _store(buffer, 2, None)  # rows without a version are never stale
    assert _first(buffer, 6) == buffer.storage.key_index(None)["key"][-2]


def test_too_many_fresh_versions_give_no_bound(
    buffer: ReplayBuffer, db_url: str, buffer_name: str
) -> None:
    _versions(buffer, 2, 6)
    with ReplayBuffer(db_url, name=buffer_name, tuning=Tuning(fresh_versions=3)) as limited:
        assert _first(limited, 3) is not None  # versions 3, 4, 5
        assert _first(limited, 2) is None  # four versions: given up


def test_a_draw_looks_only_among_the_fresh_rows(buffer: ReplayBuffer) -> None:
    _versions(buffer, 40, 50)  # 2,000 rows, versions 0..49
    _store(buffer, 10, 3)  # stale rows stored late, among the fresh
    buffer.set_policy_version(49)
    fresh = _fresh(buffer, 47)  # 120 rows: 5.8% of the buffer
    sampler = UniformSampler(seed=1, max_staleness=2)
    before = buffer.storage.spaces.keys_probed
    drawn = _draw(buffer, sampler, 200, 32)
    assert not buffer.storage.index.entries  # over the key space, no key index
    assert set(drawn.tolist()) == fresh
    keys = sorted(fresh)
    counts = np.array([(drawn == k).sum() for k in keys])
    assert chi_square_p(counts, np.ones(len(keys))) > P_MIN
    # Candidates come from the fresh part of the range: 130 keys, 120 of them fresh. Over
    # the whole range (5.8% kept) a batch would probe ~17 candidates per row.
    probed = buffer.storage.spaces.keys_probed - before
    assert probed < 2 * len(drawn)


def test_rows_without_a_version_among_the_old_ones_are_drawn(buffer: ReplayBuffer) -> None:
    _store(buffer, 8, None)
    _versions(buffer, 40, 30)
    buffer.set_policy_version(29)
    fresh = _fresh(buffer, 25)
    drawn = _draw(buffer, UniformSampler(seed=2, max_staleness=4), 100, 16)
    assert set(drawn.tolist()) == fresh


def test_the_bound_follows_the_version_both_ways(buffer: ReplayBuffer) -> None:
    _versions(buffer, 30, 20)
    buffer.set_policy_version(19)
    sampler = UniformSampler(seed=3, max_staleness=1)
    assert set(_draw(buffer, sampler, 60, 16).tolist()) == _fresh(buffer, 18)
    _store(buffer, 30, 20)
    buffer.set_policy_version(20)  # version 18 went stale
    assert set(_draw(buffer, sampler, 60, 16).tolist()) == _fresh(buffer, 19)
    buffer.set_policy_version(10, force=True)  # a restored checkpoint: older rows fresh again
    fresh = _fresh(buffer, 9)
    drawn = _draw(buffer, sampler, 200, 32)
    assert set(drawn.tolist()) == fresh


def test_deleted_first_fresh_rows_and_new_rows(buffer: ReplayBuffer) -> None:
    _versions(buffer, 30, 10)
    buffer.set_policy_version(9)
    sampler = UniformSampler(seed=4, max_staleness=1)
    _draw(buffer, sampler, 5, 8)  # the bound is found and kept
    buffer.delete(QueryBuilder().eq("exp_meta.policy_version", 8).build())
    _store(buffer, 5, 9)
    _store(buffer, 5, None)
    assert set(_draw(buffer, sampler, 100, 16).tolist()) == _fresh(buffer, 8)
    buffer.delete(QueryBuilder().gte("exp_meta.policy_version", 8).build())
    buffer.delete(QueryBuilder().is_null("exp_meta.policy_version").build())
    with pytest.raises(EmptyBufferError, match="max_staleness"):
        sampler.sample(buffer.storage, 8)


def test_an_epoch_with_max_staleness_walks_the_fresh_part(buffer: ReplayBuffer) -> None:
    _versions(buffer, 40, 50)
    _store(buffer, 10, 2)
    buffer.set_policy_version(49)
    fresh = _fresh(buffer, 47)
    sampler = UniformSampler(replacement=False, seed=5, max_staleness=2)
    before = buffer.storage.spaces.keys_probed
    for _ in range(2):
        epoch: list[int] = []
        while len(epoch) < len(fresh):
            sampler.sample(buffer.storage, 25)
            epoch += sampler.last_keys.tolist()
        assert sorted(epoch) == sorted(fresh)  # each fresh row once
    assert sampler._epoch is None  # walked over the key space, not a key index
    assert buffer.storage.spaces.keys_probed - before < 4 * 2 * len(fresh)


def test_groups_over_the_key_space_come_from_the_fresh_part(buffer: ReplayBuffer) -> None:
    _versions(buffer, 40, 50)  # groups of 4 rows by task within each version
    buffer.set_policy_version(49)
    sampler = GroupSampler("task_id", 4, seed=6, max_staleness=2)
    sampler.summaries_up_to = 0  # over the key space
    fresh = _fresh(buffer, 47)
    before = buffer.storage.spaces.keys_probed
    drawn = _draw(buffer, sampler, 30, 8)
    assert set(drawn.tolist()) <= fresh
    assert len(set(drawn.tolist())) == 3 * 4 * 4  # every ready group: 3 versions x 4 tasks
    assert buffer.storage.spaces.keys_probed - before < 50 * len(drawn)


def _probes(buffer: ReplayBuffer, sampler, calls: int, batch: int) -> tuple[set[int], int]:
    before = buffer.storage.spaces.keys_probed
    drawn = _draw(buffer, sampler, calls, batch)
    return set(drawn.tolist()), buffer.storage.spaces.keys_probed - before


def test_when_the_stale_rows_are_the_oldest_a_draw_probes_nothing(buffer: ReplayBuffer) -> None:
    _versions(buffer, 30, 20)
    buffer.set_policy_version(19)
    sampler = UniformSampler(seed=7, max_staleness=3)
    drawn = _draw(buffer, sampler, 100, 16)
    assert not buffer.storage.index.entries
    assert set(drawn.tolist()) == _fresh(buffer, 16)
    keys = sorted(_fresh(buffer, 16))
    counts = np.array([(drawn == k).sum() for k in keys])
    assert chi_square_p(counts, np.ones(len(keys))) > P_MIN
    assert _probes(buffer, sampler, 10, 16)[1] == 0
    _store(buffer, 30, 19)  # new fresh rows: read for stale ones, none found
    drawn_now, probed = _probes(buffer, sampler, 60, 16)
    assert probed == 0 and drawn_now == _fresh(buffer, 16)


def test_stale_rows_stored_late_are_never_drawn(buffer: ReplayBuffer) -> None:
    _versions(buffer, 30, 20)
    buffer.set_policy_version(19)
    sampler = UniformSampler(seed=8, max_staleness=3)
    _draw(buffer, sampler, 5, 16)  # what is known of the stale rows is kept
    _store(buffer, 6, 2)  # a slow worker's rollouts of an old policy
    _store(buffer, 30, 19)
    drawn, probed = _probes(buffer, sampler, 100, 16)
    assert drawn == _fresh(buffer, 16) and probed > 0  # probed: the late rows are stale
    buffer.set_policy_version(25)  # every row below the new ones is stale now
    _store(buffer, 30, 25)
    drawn, probed = _probes(buffer, sampler, 60, 16)
    assert drawn == _fresh(buffer, 22) and probed == 0


def test_gaps_or_too_many_stale_versions_mean_probes(
    buffer: ReplayBuffer, db_url: str, buffer_name: str
) -> None:
    _versions(buffer, 30, 20)
    buffer.set_policy_version(19)
    eight = Tuning(fresh_versions=8)  # 17 stale versions: not worked out
    with ReplayBuffer(db_url, name=buffer_name, tuning=eight) as limited:
        drawn, probed = _probes(limited, UniformSampler(seed=9, max_staleness=2), 60, 16)
        assert drawn == _fresh(buffer, 17) and probed > 0
    buffer.delete(QueryBuilder().eq("exp_meta.step", 3).build())  # gaps among fresh rows
    drawn, probed = _probes(buffer, UniformSampler(seed=9, max_staleness=2), 60, 16)
    assert drawn == _fresh(buffer, 17) and probed > 0


def test_recency_with_max_staleness_ranks_the_fresh_rows(buffer: ReplayBuffer) -> None:
    _versions(buffer, 20, 6)  # 120 rows, versions 0..5
    buffer.set_policy_version(5)
    fresh = sorted(_fresh(buffer, 3))  # 60 rows, ranked by key
    sampler = RecencySampler(power=1.0, seed=11, max_staleness=2)
    firsts = []
    for _ in range(1500):
        sampler.sample(buffer.storage, 3)
        assert len(set(sampler.last_keys.tolist())) == 3
        firsts.append(int(sampler.last_keys[0]))
    assert not buffer.storage.index.entries  # over the key space, no key index
    assert set(firsts) <= set(fresh)
    counts = np.array([firsts.count(k) for k in fresh])
    assert chi_square_p(counts, np.arange(1, 61, dtype=float)) > P_MIN
    _store(buffer, 4, 1)  # stale rows among the fresh: left out of the ranks
    drawn = _draw(buffer, RecencySampler(seed=12, max_staleness=2), 50, 3)
    assert not buffer.storage.index.entries  # still over the key space
    assert set(drawn.tolist()) <= _fresh(buffer, 3)


def test_what_is_found_is_kept_per_server(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found on one server, kept for it: another URL (a replica) finds it again."""
    url, other = f"sqlite:///{tmp_path}/b.db", f"sqlite:///{tmp_path}/./b.db"
    with ReplayBuffer(url, name="b") as one, ReplayBuffer(other, name="b") as two:
        _versions(one, 10, 5)
        one.set_policy_version(4)
        calls: list[int] = []
        found = versions.last_stale_key

        def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            calls.append(1)
            return found(*args, **kwargs)

        monkeypatch.setattr(versions, "last_stale_key", counted)
        bounds = versions.FreshBounds()
        for buffer, expected in ((one, 1), (one, 1), (two, 2), (one, 2)):
            handle = buffer.sql.handle
            with handle.read() as conn:
                low = bounds.first(handle, conn, 3)
                assert low is not None
                assert not bounds.stale_from(handle, conn, 3, low, low + 19)
            assert len(calls) == expected
