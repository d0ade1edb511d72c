"""Epochs over the key space (expstore.samplers.epochs): a keyed permutation of the key
range, each row exactly once per epoch without holding the buffer's keys, on both
backends."""

from __future__ import annotations

import numpy as np
import pytest

from expstore import ReplayBuffer
from expstore.query import QueryBuilder
from expstore.samplers import UniformSampler
from expstore.samplers.epochs import KeyPermutation
from tests.helpers import make_row, make_rows
from tests.samplers.stats import chi_square_p


@pytest.mark.parametrize("size", [*range(1, 70), 255, 256, 257, 1000, 4097])
def test_the_permutation_is_a_bijection_of_the_range(size: int) -> None:
    for seed in range(3):
        image = KeyPermutation(size, np.random.default_rng(seed))(np.arange(size))
        assert image.dtype == np.int64
        assert sorted(image.tolist()) == list(range(size))


def test_a_large_permutation_is_computed_for_any_positions() -> None:
    size = 10_000_019
    permutation = KeyPermutation(size, np.random.default_rng(1))
    positions = np.random.default_rng(2).choice(size, 100_000, replace=False)
    image = permutation(positions)
    assert len(np.unique(image)) == len(positions) and image.min() >= 0 and image.max() < size
    np.testing.assert_array_equal(permutation(positions[:10]), image[:10])  # a function


def test_orders_look_random_across_seeds() -> None:
    firsts, before = [], 0
    for seed in range(4000):
        image = KeyPermutation(10, np.random.default_rng(seed))(np.arange(10))
        firsts.append(int(np.flatnonzero(image == 0)[0]))  # where key 0 lands
        before += int(image[3] < image[7])
    assert chi_square_p(np.bincount(firsts, minlength=10), np.ones(10)) > 1e-4
    assert 1800 < before < 2200  # about half


def _ids(rows) -> list[str]:  # noqa: ANN001
    return [r.id for r in rows]


def _flat_epoch(sampler: UniformSampler) -> bool:
    return sampler._flat_epoch is not None and sampler._epoch is None


def test_each_row_once_per_epoch_over_the_key_space(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(97))
    everyone = sorted(_ids(buffer.query()))
    sampler = UniformSampler(replacement=False, seed=4)
    orders = []
    for _ in range(3):
        epoch: list[str] = []
        while len(epoch) < 97:
            batch = sampler.sample(buffer.storage, 10)
            assert _flat_epoch(sampler) and not buffer.storage.index.entries
            epoch += _ids(batch)
            assert len(batch) == min(10, 97 - (len(epoch) - len(batch)))  # short at the end
        assert sorted(epoch) == everyone
        orders.append(epoch)
    assert orders[0] != orders[1] != orders[2]


def test_rows_stored_or_deleted_mid_epoch(buffer: ReplayBuffer, db_url: str) -> None:
    buffer.store_batch(make_rows(30, tasks=3))
    with ReplayBuffer(db_url, name=buffer.storage.name + "_other") as other:
        other.store_batch(make_rows(4))  # a few keys of another buffer in between
    buffer.store_batch(make_rows(10, tasks=3))
    sampler = UniformSampler(replacement=False, seed=5)
    seen = _ids(sampler.sample(buffer.storage, 12))
    assert _flat_epoch(sampler)
    gone = set(_ids(buffer.query(QueryBuilder().eq("exp_meta.task_id", "task1").build())))
    buffer.delete(QueryBuilder().eq("exp_meta.task_id", "task1").build())
    late = make_rows(5)
    buffer.store_batch(late)
    while sampler._flat_epoch.position < sampler._flat_epoch.span:
        seen += _ids(sampler.sample(buffer.storage, 7))
    assert len(seen) == len(set(seen))  # once each
    assert not set(_ids(late)) & set(seen)  # rows stored mid-epoch wait for the next
    assert set(seen) >= set(_ids(buffer.query())) - set(_ids(late))
    assert set(seen) - set(_ids(buffer.query())) <= gone  # the deleted only if seen before
    following = _ids(sampler.sample(buffer.storage, 1000))
    assert sorted(following) == sorted(_ids(buffer.query()))  # all of them, late ones too


def test_a_buffer_whose_keys_are_mostly_another_buffers_uses_the_key_index(
    buffer: ReplayBuffer, db_url: str
) -> None:
    with ReplayBuffer(db_url, name=buffer.storage.name + "_big") as other:
        for _ in range(3):
            buffer.store_batch(make_rows(2))
            other.store_batch(make_rows(40))
    sampler = UniformSampler(replacement=False, seed=6)
    epoch = _ids(sampler.sample(buffer.storage, 100))
    assert sampler._flat_epoch is None and sampler._epoch is not None
    assert sorted(epoch) == sorted(_ids(buffer.query()))


def test_an_epoch_stays_on_the_path_it_began_on(buffer: ReplayBuffer) -> None:
    """An epoch begun over the key index is finished over it when the sampler may walk
    the key space again; the next epoch walks the key space."""
    buffer.store_batch(make_rows(20))
    everyone = sorted(_ids(buffer.query()))
    sampler = UniformSampler(replacement=False, seed=7)
    sampler.flat = False
    epoch = _ids(sampler.sample(buffer.storage, 6))
    sampler.flat = True
    while len(epoch) < 20:
        epoch += _ids(sampler.sample(buffer.storage, 6))
        assert sampler._flat_epoch is None  # still the key-index epoch
    assert sorted(epoch) == everyone
    following = [i for _ in range(4) for i in _ids(sampler.sample(buffer.storage, 5))]
    assert sampler._flat_epoch is not None  # the next epoch walks the key space
    assert sorted(following) == everyone


def test_a_key_index_finishes_an_unfinished_key_space_epoch(buffer: ReplayBuffer) -> None:
    """Switching to the key index mid-epoch finishes that epoch there (its rows not
    reached yet, none twice); switching back starts a fresh one over the key space, not
    the rest of the old one again (found by review)."""
    buffer.store_batch(make_rows(20))
    everyone = sorted(_ids(buffer.query()))
    sampler = UniformSampler(replacement=False, seed=8)
    first = _ids(sampler.sample(buffer.storage, 6))  # a key-space epoch, 14 rows owed
    sampler.flat = False
    rest = [i for _ in range(3) for i in _ids(sampler.sample(buffer.storage, 5))]
    assert len(rest) == 14 and sorted(first + rest) == everyone  # the same epoch
    by_index = [i for _ in range(4) for i in _ids(sampler.sample(buffer.storage, 5))]
    assert sorted(by_index) == everyone  # one whole key-index epoch
    sampler.flat = True
    fresh = [i for _ in range(4) for i in _ids(sampler.sample(buffer.storage, 5))]
    assert sorted(fresh) == everyone  # a whole new epoch, not the 14 rows owed


@pytest.mark.parametrize("flat", [True, False], ids=["key space", "key index"])
def test_a_batch_chosen_again_loses_no_row_of_the_epoch(
    buffer: ReplayBuffer, flat: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row deleted between choosing and fetching makes the batch be chosen again; the
    epoch goes on from where that batch began, so only the deleted row is missing from it
    (found by review: the other rows of the first choice were lost to the epoch)."""
    buffer.store_batch(make_rows(30))
    sampler = UniformSampler(replacement=False, seed=9)
    sampler.flat = flat
    storage = buffer.storage
    fetch = type(storage).fetch
    deleted: list[str] = []

    def fetch_after_a_delete(self, keys, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        if not deleted:  # another process deletes one chosen row first
            victim = self.fetch_keys(keys[:1])[0]
            buffer.delete(QueryBuilder().eq("id", victim.id).build())
            deleted.append(victim.id)
        return fetch(self, keys, *args, **kwargs)

    monkeypatch.setattr(type(storage), "fetch", fetch_after_a_delete)
    epoch = [i for _ in range(5) for i in _ids(sampler.sample(storage, 6))]
    assert deleted and deleted[0] not in epoch
    assert sorted(epoch) == sorted(_ids(buffer.query()))  # the 29 left, each once


def test_a_batch_chosen_again_under_a_new_condition_starts_its_epoch_afresh(
    buffer: ReplayBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first batch under a new condition, chosen again, still begins that condition's
    epoch (found by review: the old condition's epoch came back)."""
    buffer.store_batch(make_rows(40, agents=2))
    sampler = UniformSampler(replacement=False, seed=10)
    sampler.sample(buffer.storage, 5, QueryBuilder().lt("exp_meta.step", 6).build())
    storage = buffer.storage
    fetch = type(storage).fetch
    deleted: list[str] = []

    def fetch_after_a_delete(self, keys, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        if not deleted:
            victim = self.fetch_keys(keys[:1])[0]
            buffer.delete(QueryBuilder().eq("id", victim.id).build())
            deleted.append(victim.id)
        return fetch(self, keys, *args, **kwargs)

    monkeypatch.setattr(type(storage), "fetch", fetch_after_a_delete)
    cond = QueryBuilder().eq("exp_meta.agent_id", "agent1").build()
    epoch = [i for _ in range(4) for i in _ids(sampler.sample(storage, 5, cond))]
    assert sorted(epoch) == sorted(_ids(buffer.query(cond)))  # the 19 left, each once


def test_an_epoch_under_a_condition_walks_the_key_space(buffer: ReplayBuffer) -> None:
    """Under a condition an epoch walks the key range too, keeping the matching rows: each
    once, in an order that differs from epoch to epoch, without the key index."""
    buffer.store_batch(make_rows(120, agents=3))
    cond = QueryBuilder().eq("exp_meta.agent_id", "agent1").build()
    matching = sorted(_ids(buffer.query(cond)))
    sampler = UniformSampler(replacement=False, seed=11)
    orders = []
    for _ in range(3):
        epoch: list[str] = []
        while len(epoch) < len(matching):
            batch = sampler.sample(buffer.storage, 7, cond)
            assert _flat_epoch(sampler) and not buffer.storage.index.entries
            epoch += _ids(batch)
        assert sorted(epoch) == matching
        orders.append(epoch)
    assert orders[0] != orders[1] != orders[2]
    # max_staleness narrows the same walk
    buffer.store_batch([make_row("t", "agent1", i, version=v) for i, v in enumerate([1, 5, 6])])
    buffer.set_policy_version(6)
    fresh = QueryBuilder().eq("exp_meta.agent_id", "agent1").build()
    stale = UniformSampler(replacement=False, seed=12, max_staleness=1)
    got = _ids(stale.sample(buffer.storage, 500, fresh))
    assert _flat_epoch(stale)
    unversioned_or_fresh = [
        r.id
        for r in buffer.query(fresh)
        if r.exp_meta.policy_version is None or r.exp_meta.policy_version >= 5
    ]
    assert sorted(got) == sorted(unversioned_or_fresh)


def test_matching_rows_deleted_or_stored_mid_epoch(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(60, agents=2, tasks=3))
    cond = QueryBuilder().eq("exp_meta.agent_id", "agent0").build()
    sampler = UniformSampler(replacement=False, seed=13)
    seen = _ids(sampler.sample(buffer.storage, 5, cond))
    assert _flat_epoch(sampler)
    gone = QueryBuilder().eq("exp_meta.task_id", "task2").build()
    removed = set(_ids(buffer.query(gone)))
    buffer.delete(gone)
    late = [make_row("late", "agent0", i) for i in range(3)]
    buffer.store_batch(late)
    while sampler._flat_epoch.position < sampler._flat_epoch.span:
        seen += _ids(sampler.sample(buffer.storage, 4, cond))
    assert len(seen) == len(set(seen))
    left = set(_ids(buffer.query(cond))) - set(_ids(late))
    assert left <= set(seen) and set(seen) - left <= removed
    assert sorted(_ids(sampler.sample(buffer.storage, 100, cond))) == sorted(
        _ids(buffer.query(cond))
    )  # the next epoch: every matching row, the late ones too


def test_an_epoch_under_a_rare_condition_uses_the_key_index(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(300, tasks=150))  # task7 holds 2 of 300 rows
    cond = QueryBuilder().eq("exp_meta.task_id", "task7").build()
    sampler = UniformSampler(replacement=False, seed=14)
    epoch = _ids(sampler.sample(buffer.storage, 100, cond))
    assert sampler._flat_epoch is None and sampler._epoch is not None
    assert sorted(epoch) == sorted(_ids(buffer.query(cond)))


@pytest.mark.parametrize("size", [1, 2, 5, 64, 1000, 4097])
def test_the_inverse_permutation_gives_back_the_positions(size: int) -> None:
    permutation = KeyPermutation(size, np.random.default_rng(size))
    positions = np.arange(size)
    np.testing.assert_array_equal(permutation.inverse(permutation(positions)), positions)


def test_an_epoch_whose_rows_go_stale_goes_on_over_the_key_index(buffer: ReplayBuffer) -> None:
    """When most of an epoch's range stops matching mid-epoch, a call probes its budget
    and the rest of the epoch goes on over the key index: the rows not reached yet, none
    twice, none left out (found by review: the walk went through the whole rest of the
    range in one call)."""
    rows = make_rows(3000, tasks=50)
    rng = np.random.default_rng(9)
    later = set(rng.choice(3000, 20, replace=False).tolist())
    for i, row in enumerate(rows):
        row.exp_meta.policy_version = 2 if i in later else 1
    buffer.store_batch(rows)
    buffer.set_policy_version(1)
    sampler = UniformSampler(replacement=False, seed=10, max_staleness=0)
    sampler.probe_budget = 64  # with batches of 2: 256 a call
    before: list[str] = []
    for _ in range(10):
        before += _ids(sampler.sample(buffer.storage, 2))
    assert _flat_epoch(sampler)
    buffer.set_policy_version(2)  # only the 20 rows of version 2 are fresh now
    fresh = {rows[i].id for i in later}
    owed = fresh - set(before)
    rest: list[str] = []
    index = buffer.storage.spaces
    while len(rest) < len(owed):
        probed = index.keys_probed
        rest += _ids(sampler.sample(buffer.storage, 2))
        assert index.keys_probed - probed <= 256  # never the whole rest of the range
    assert sampler._epoch is not None  # over the key index now
    assert len(rest) == len(set(rest)) and set(rest) == owed
    following = [i for _ in range(10) for i in _ids(sampler.sample(buffer.storage, 2))]
    assert sorted(following) == sorted(fresh)  # the next epoch: every fresh row once


def test_a_hand_over_chosen_again_finishes_the_same_epoch(
    buffer: ReplayBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call that hands an epoch over to the key index is chosen again (a rate limit's
    wait): the sampler goes back to before it and the key index still finishes that epoch
    (found by review: a new epoch began there, rows came twice)."""
    rows = make_rows(3000, tasks=50)
    later = set(np.random.default_rng(11).choice(3000, 20, replace=False).tolist())
    for i, row in enumerate(rows):
        row.exp_meta.policy_version = 2 if i in later else 1
    buffer.store_batch(rows)
    buffer.set_policy_version(1)
    sampler = UniformSampler(replacement=False, seed=12, max_staleness=0)
    sampler.probe_budget = 64
    before = [i for _ in range(15) for i in _ids(sampler.sample(buffer.storage, 100))]
    buffer.set_policy_version(2)
    storage = buffer.storage
    acquire, waits = storage.acquire_samples, []

    def wait_once(n, since=None):  # noqa: ANN001, ANN202
        counted, waited = acquire(n, since=since)
        if not waits and sampler._epoch is not None:  # the call that handed over
            waits.append(n)
            return counted, True
        return counted, waited

    monkeypatch.setattr(storage, "acquire_samples", wait_once)
    owed = {rows[i].id for i in later} - set(before)
    assert 0 < len(owed) < len(later)  # the epoch returned some of the fresh rows already
    rest: list[str] = []
    while len(rest) < len(owed):
        rest += _ids(sampler.sample(storage, 2))
    assert waits and len(rest) == len(set(rest)) and set(rest) == owed


@pytest.mark.parametrize("flat", [True, False])
def test_rows_deleted_mid_epoch_leave_no_short_batch_before_its_end(
    buffer: ReplayBuffer, flat: bool
) -> None:
    buffer.store_batch(make_rows(20))
    sampler = UniformSampler(replacement=False, seed=2)
    sampler.flat = flat
    seen = _ids(sampler.sample(buffer.storage, 5))
    pending = [i for i in _ids(buffer.query()) if i not in seen][:4]
    buffer.delete(QueryBuilder().in_("id", pending).build())
    # 11 rows of the epoch are left: two full batches, then the short last one
    sizes = [len(sampler.sample(buffer.storage, 5)) for _ in range(3)]
    assert sizes == [5, 5, 1]
    assert len(sampler.sample(buffer.storage, 5)) == 5  # a new epoch
