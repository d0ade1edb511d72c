"""Policy versions and staleness: one current version per buffer for every process;
samplers, claims and the "stale" eviction leave out rows older than current - k."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from expstore import (
    GroupSampler,
    PolicyVersionError,
    PrioritizedSampler,
    QueryBuilder,
    RateLimiter,
    ReplayBuffer,
    SliceSampler,
    StratifiedSampler,
    UniformSampler,
)
from expstore.claims.group_claims import claimable_groups
from expstore.errors import EmptyBufferError, InvalidArgumentError
from expstore.samplers import LatestSampler, RecencySampler, RewardWeightedSampler
from tests.helpers import make_row


def versioned(buffer: ReplayBuffer, versions: list[int | None], per: int = 5) -> None:
    """``per`` rows of each version (a task per version), steps 0..per-1."""
    buffer.store_batch(
        [
            make_row(f"v{v}", f"a{i % 2}", i, reward=float(i), version=v)
            for v in versions
            for i in range(per)
        ]
    )


def test_the_version_is_kept_with_the_buffer_for_every_handle(buf: ReplayBuffer) -> None:
    assert buf.policy_version() is None
    buf.set_policy_version(3)
    other = ReplayBuffer(buf.storage.url, name=buf.storage.name)
    try:
        assert other.policy_version() == 3
        other.set_policy_version(4)
        assert buf.policy_version() == 4
    finally:
        other.close()


def test_policy_version_is_a_queryable_indexed_column(buf: ReplayBuffer) -> None:
    versioned(buf, [1, 2, None])
    assert buf.count(QueryBuilder().eq("exp_meta.policy_version", 2).build()) == 5
    assert buf.count(QueryBuilder().gte("policy_version", 1).build()) == 10
    got = {r.exp_meta.policy_version for r in buf.query()}
    assert got == {1, 2, None}


def test_a_version_going_backwards_is_refused_unless_forced(buf: ReplayBuffer) -> None:
    buf.set_policy_version(5)
    with pytest.raises(PolicyVersionError, match="force=True"):
        buf.set_policy_version(4)
    assert buf.policy_version() == 5
    buf.set_policy_version(5)  # the same version again is fine
    buf.set_policy_version(2, force=True)
    assert buf.policy_version() == 2


@pytest.mark.parametrize("bad", [-1, 1.5, "3", None, True])
def test_bad_versions_are_refused(buf: ReplayBuffer, bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="version must be an int >= 0"):
        buf.set_policy_version(bad)  # type: ignore[arg-type]
    assert buf.policy_version() is None


@pytest.mark.parametrize("bad", [-1, -3])
def test_rows_with_bad_versions_are_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="policy_version"):
        make_row(version=bad)


@pytest.mark.parametrize("bad", [-1, 0.5, "k"])
def test_bad_max_staleness_is_refused(buf: ReplayBuffer, bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="max_staleness"):
        UniformSampler(max_staleness=bad)  # type: ignore[arg-type]
    versioned(buf, [1])
    with pytest.raises(InvalidArgumentError, match="max_staleness"):
        buf.claim(1, consumer="c", max_staleness=bad)  # type: ignore[arg-type]


SAMPLERS = [
    lambda k: UniformSampler(seed=0, max_staleness=k),
    lambda k: UniformSampler(False, seed=0, max_staleness=k),
    lambda k: PrioritizedSampler(seed=0, max_staleness=k),
    lambda k: RecencySampler(seed=0, max_staleness=k),
    lambda k: RewardWeightedSampler(seed=0, max_staleness=k),
    lambda k: StratifiedSampler(seed=0, max_staleness=k),
    lambda k: LatestSampler(seed=0, max_staleness=k),
    lambda k: SliceSampler(1, seed=0, max_staleness=k),
]


@pytest.mark.parametrize("make", SAMPLERS, ids=lambda m: type(m(0)).__name__)
def test_every_sampler_leaves_out_stale_rows(buf: ReplayBuffer, make) -> None:
    versioned(buf, [1, 2, 3, 4, None])
    buf.set_policy_version(4)
    sampler = make(1)  # versions 3 and 4 (and rows without a version) are fresh
    seen = Counter()
    for _ in range(20):
        for row in buf.sample(sampler, batch_size=8):
            seen[row.exp_meta.policy_version] += 1
    assert set(seen) <= {3, 4, None}
    assert set(seen) & {3, 4}
    # The trainer moves on: every process sees version 6 at once, so now only 4 remains.
    buf.set_policy_version(6)
    for _ in range(10):
        assert {r.exp_meta.policy_version for r in buf.sample(sampler, batch_size=8)} <= {
            None,
            4,
        }


def test_staleness_zero_keeps_only_the_current_version(buf: ReplayBuffer) -> None:
    versioned(buf, [1, 2])
    buf.set_policy_version(2)
    got = {
        r.exp_meta.policy_version
        for r in buf.sample(UniformSampler(max_staleness=0), None, None, 50)
    }
    assert got == {2}


def test_without_a_current_version_nothing_is_stale(buf: ReplayBuffer) -> None:
    versioned(buf, [1, 9])
    got = {
        r.exp_meta.policy_version
        for r in buf.sample(UniformSampler(max_staleness=0, seed=1), batch_size=80)
    }
    assert got == {1, 9}


def test_only_stale_rows_raise_an_empty_buffer_error_that_says_so(buf: ReplayBuffer) -> None:
    versioned(buf, [1])
    buf.set_policy_version(10)
    with pytest.raises(
        EmptyBufferError, match=r"max_staleness=2 policy versions behind the current version 10"
    ):
        buf.sample(UniformSampler(max_staleness=2), batch_size=4)


def test_a_sampler_without_max_staleness_draws_every_row(buf: ReplayBuffer) -> None:
    versioned(buf, [1, 2])
    buf.set_policy_version(100)
    got = {r.exp_meta.policy_version for r in buf.sample(UniformSampler(seed=0), batch_size=60)}
    assert got == {1, 2}


def test_claims_with_max_staleness_take_only_fresh_rows(buf: ReplayBuffer) -> None:
    versioned(buf, [1, 2, 3, None], per=4)
    buf.set_policy_version(3)
    claim = buf.claim(100, consumer="learner", max_staleness=1)
    assert Counter(r.exp_meta.policy_version for r in claim.batch) == {2: 4, 3: 4, None: 4}
    claim.ack()
    # Nothing fresh is left: the stale rows stay unclaimed (and countable).
    assert len(buf.claim(10, consumer="learner", max_staleness=1)) == 0
    assert buf.wait_for(1, claimable=True, max_staleness=5, timeout_s=0) == 1
    random_order = buf.claim(10, consumer="other", order="random", max_staleness=5)
    assert {r.exp_meta.policy_version for r in random_order.batch} == {1}


def test_claims_follow_the_version_as_it_moves(buf: ReplayBuffer) -> None:
    versioned(buf, [1, 2], per=3)
    buf.set_policy_version(1)
    first = buf.claim(2, consumer="c", max_staleness=0)
    assert {r.exp_meta.policy_version for r in first.batch} == {1}
    first.ack()
    buf.set_policy_version(2)
    rest = buf.claim(10, consumer="c", max_staleness=0)
    assert {r.exp_meta.policy_version for r in rest.batch} == {2}  # the last v1 row is stale


def test_stale_eviction_drops_old_rows_at_each_write_and_version_change(buf: ReplayBuffer) -> None:
    with pytest.raises(InvalidArgumentError, match="stale_after=k"):
        buf.set_retention(None, "stale")
    versioned(buf, [1, 2, 3, None], per=2)
    assert buf.set_retention(None, "stale", stale_after=1) == 0  # no version yet
    assert buf.set_policy_version(3) == 2  # version 1 goes with the version change
    assert Counter(r.exp_meta.policy_version for r in buf.query()) == {2: 2, 3: 2, None: 2}
    buf.storage.set_policy_version  # noqa: B018 - the storage API is the buffer's
    # Another process moves the version without this handle knowing: the next write evicts.
    other = ReplayBuffer(buf.storage.url, name=buf.storage.name)
    try:
        other.set_policy_version(4)
    finally:
        other.close()
    versioned(buf, [4], per=1)
    assert Counter(r.exp_meta.policy_version for r in buf.query()) == {3: 2, 4: 1, None: 2}


def test_stale_eviction_with_a_capacity_also_keeps_the_capacity(buf: ReplayBuffer) -> None:
    buf.set_retention(4, "stale", stale_after=0)
    buf.set_policy_version(1)
    versioned(buf, [0, 1], per=3)
    kept = [r.exp_meta.policy_version for r in buf.query()]
    assert kept == [1, 1, 1]
    versioned(buf, [1], per=3)
    assert len(buf) == 4


def test_a_handle_cannot_ask_for_stale_eviction_without_its_k(
    db_url: str, buffer_name: str
) -> None:
    with pytest.raises(InvalidArgumentError, match="set_retention"):
        ReplayBuffer(db_url, name=buffer_name, eviction="stale")
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.set_retention(None, "stale", stale_after=2)
    with ReplayBuffer(db_url, name=buffer_name, eviction="stale") as again:
        assert again.storage.eviction == "stale"


def test_cached_indexes_follow_versions_without_rereading(buf: ReplayBuffer) -> None:
    versioned(buf, list(range(10)), per=10)
    sampler = UniformSampler(seed=0, max_staleness=2)
    sampler.flat = False  # the key-index path, whose cache this is about
    for version in range(10):
        buf.set_policy_version(version)
        got = np.array([r.exp_meta.policy_version for r in buf.sample(sampler, batch_size=64)])
        assert got.min() >= version - 2
    # The index was read once: moving the version only re-filters the cached arrays.
    assert buf.storage.index.rows_read == 100


def test_staleness_aware_sampling_weighs_rows_one_over_staleness_plus_one(
    buf: ReplayBuffer,
) -> None:
    from expstore import StalenessAwareSampler
    from tests.samplers.stats import chi_square_p

    versioned(buf, [0, 1, 2, 3, None], per=1)
    buf.set_policy_version(3)
    sampler = StalenessAwareSampler(seed=0)
    counts = Counter()
    for _ in range(40):
        counts.update(r.exp_meta.policy_version for r in buf.sample(sampler, batch_size=500))
    order = [0, 1, 2, 3, None]
    weights = np.array([1 / 4, 1 / 3, 1 / 2, 1.0, 1.0])  # no version: as fresh as can be
    observed = np.array([counts[v] for v in order])
    assert chi_square_p(observed, weights / weights.sum()) > 1e-4
    capped = StalenessAwareSampler(seed=0, max_staleness=1)
    assert {r.exp_meta.policy_version for r in buf.sample(capped, batch_size=200)} == {2, 3, None}


def test_task_samplers_leave_out_tasks_with_stale_rows(buf: ReplayBuffer) -> None:
    from expstore import RandomTaskSampler

    versioned(buf, [1, 2, 3], per=2)  # tasks v1, v2, v3
    buf.store(make_row("v3", "a0", 9, version=1))  # task v3 now also holds a stale row
    buf.set_policy_version(3)
    sampler = RandomTaskSampler(seed=0, max_staleness=1)
    got = {r.exp_meta.task_id for r in buf.sample(sampler, batch_size=10)}
    assert got == {"v2"}
    assert set(buf.sample_task(sampler, batch_size=10)[0][0].exp_meta.task_id for _ in [0]) == {
        "v2"
    }
    buf.set_policy_version(9)
    with pytest.raises(EmptyBufferError, match="every matching task"):
        buf.sample(sampler, batch_size=2)


def test_a_claim_after_the_version_was_forced_back_takes_rows_fresh_again(
    buf: ReplayBuffer,
) -> None:
    """A FIFO claim's floor moved past rows that were stale; forced back, the version
    makes them fresh, and the same handle claims them (found by review: only a new
    handle did)."""
    versioned(buf, [0, 0, 10], per=4)
    buf.set_policy_version(10)
    fresh = buf.claim(5, consumer="x", max_staleness=2)
    assert {r.exp_meta.policy_version for r in fresh.batch} == {10}
    buf.set_policy_version(1, force=True)  # a restored checkpoint: version 0 is fresh again
    assert buf.wait_for(1, claimable=True, max_staleness=2, timeout_s=0) == 1
    again = buf.claim(20, consumer="x", max_staleness=2)
    assert [r.exp_meta.policy_version for r in again.batch] == [0] * 8


def test_a_group_claim_keeps_to_the_claims_max_staleness(buf: ReplayBuffer) -> None:
    """max_staleness given to claim() holds for whole groups too (found by review: only
    the sampler's own was applied)."""
    for version, prompt in ((0, "old"), (10, "new")):
        buf.store_batch(
            [make_row(prompt, f"c{i}", 0, reward=float(i), version=version) for i in range(4)]
        )
    buf.set_policy_version(10)
    claim = buf.claim(8, consumer="g", order=GroupSampler(group_size=4), max_staleness=2)
    assert {r.exp_meta.task_id for r in claim.batch} == {"new"}
    stale = buf.claim(4, consumer="g", order=GroupSampler(group_size=4), max_staleness=2)
    assert len(stale) == 0
    looser = GroupSampler(group_size=4, max_staleness=20)  # the tighter of the two counts
    assert len(buf.claim(4, consumer="g", order=looser, max_staleness=2)) == 0


def test_a_group_claim_finds_a_fresh_group_behind_many_stale_ones(buf: ReplayBuffer) -> None:
    """The database's claimable groups come oldest first; stale ones must not crowd out the
    fresh one (found by review: the wait timed out and a rate-limited claim came back
    empty)."""
    for p in range(10):
        buf.store_batch(
            [make_row(f"old{p}", f"c{i}", 0, reward=float(i), version=0) for i in range(2)]
        )
    buf.store_batch([make_row("new", f"c{i}", 0, reward=float(i), version=10) for i in range(2)])
    buf.set_policy_version(10)
    sampler = GroupSampler(group_size=2)
    assert claimable_groups(sampler, buf.storage, None, 2, 1) == 1
    claim = buf.claim(2, consumer="g", order=sampler, max_staleness=2, wait_s=5)
    assert {r.exp_meta.task_id for r in claim.batch} == {"new"}
    claim.release()
    buf.set_rate_limiter(RateLimiter(min_size=1, samples_per_insert=1.0, timeout_s=0.05))
    again = buf.claim(2, consumer="g", order=GroupSampler(group_size=2), max_staleness=2)
    assert {r.exp_meta.task_id for r in again.batch} == {"new"}
