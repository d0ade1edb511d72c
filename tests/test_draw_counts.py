"""consume_after=k: a row leaves a sampler after k draws, counted in the database across
every process (TorchRL's consume-after-n-samples, for many processes)."""

from __future__ import annotations

import multiprocessing as mp
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest

from expstore import (
    ConnectionLostError,
    EmptyBufferError,
    InvalidArgumentError,
    NumpyConverter,
    PrioritizedSampler,
    QueryBuilder,
    RateLimiter,
    ReplayBuffer,
    UniformSampler,
)
from tests.helpers import make_rows

Handles = tuple[ReplayBuffer, ReplayBuffer]


@pytest.fixture
def handles(db_url: str, buffer_name: str) -> Iterator[Handles]:
    """Two handles on one buffer, as two processes have."""
    with (
        ReplayBuffer(db_url, name=buffer_name) as one,
        ReplayBuffer(db_url, name=buffer_name) as two,
    ):
        yield one, two


def drawn(buffer: ReplayBuffer, sampler, batch: int, cond=None) -> list[int]:
    conv = NumpyConverter({"i": "exp_data.state.i"})
    return buffer.sample(sampler, cond, conv, batch)["i"].tolist()


def test_each_row_is_drawn_at_most_k_times_then_the_sampler_runs_dry(
    db_url: str, buffer_name: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(make_rows(30))
        sampler = UniformSampler(seed=0, consume_after=2)
        seen: Counter[int] = Counter()
        with pytest.raises(EmptyBufferError, match="consume_after=2"):
            for _ in range(200):
                seen.update(drawn(buffer, sampler, 4))
        assert set(seen) == set(range(30))
        assert max(seen.values()) == 2 and sum(seen.values()) == 60
        ids = [r.id for r in buffer.query()]
        assert {r.times_sampled for r in buffer.lineage(ids).values()} == {2}


def test_counts_are_shared_by_every_sampler_and_handle_of_the_buffer(handles: Handles) -> None:
    one, two = handles
    one.store_batch(make_rows(20))
    first = drawn(one, UniformSampler(replacement=False, seed=1, consume_after=1), 12)
    assert len(set(first)) == 12
    rest: list[int] = []
    prioritized = PrioritizedSampler(seed=2, consume_after=1)
    with pytest.raises(EmptyBufferError):
        for _ in range(100):
            batch = drawn(two, prioritized, 8)
            assert len(batch) == len(set(batch))  # each row once per batch
            assert len(prioritized.last_info.weights) == len(batch)
            rest += batch
    assert sorted(first + rest) == list(range(20))  # no row twice across the handles
    with pytest.raises(EmptyBufferError):
        drawn(two, UniformSampler(seed=3, consume_after=1), 1)
    # Without consume_after the rows are drawn as ever.
    assert len(drawn(two, UniformSampler(seed=4), 50)) == 50


def test_consume_after_composes_with_conditions(db_url: str, buffer_name: str) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(make_rows(40))
        cond = QueryBuilder().eq("exp_meta.task_id", "task2").build()
        got = drawn(buffer, UniformSampler(replacement=False, seed=0, consume_after=1), 10, cond)
        assert sorted(got) == list(range(2, 40, 4))


def test_a_bad_consume_after_is_refused() -> None:
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(InvalidArgumentError, match="consume_after"):
            UniformSampler(consume_after=bad)


def _draw_all(url: str, name: str, seed: int, out: mp.Queue) -> None:
    taken: list[int] = []
    with ReplayBuffer(url, name=name) as buffer:
        sampler = UniformSampler(seed=seed, consume_after=1)
        try:
            while True:
                taken += drawn(buffer, sampler, 16)
        except EmptyBufferError:
            pass
    out.put(taken)


@pytest.mark.slow
def test_processes_drawing_at_once_never_exceed_the_count(db_url: str, buffer_name: str) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(make_rows(600))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_draw_all, args=(db_url, buffer_name, s, out)) for s in range(3)]
    for p in procs:
        p.start()
    every = [i for _ in procs for i in out.get(timeout=300)]
    for p in procs:
        p.join()
    assert sorted(every) == list(range(600))  # each row exactly once across the processes


def test_draws_over_the_key_space_leave_spent_rows_out(handles: Handles) -> None:
    """Flat draws probe the counts with the rows: a row another process spent is never a
    candidate (the database refuses none), and no key index is read."""
    one, two = handles
    one.store_batch(make_rows(50))
    first = drawn(one, UniformSampler(replacement=False, seed=5, consume_after=1), 20)
    with_replacement = UniformSampler(seed=6, consume_after=1)
    second = [i for _ in range(5) for i in drawn(two, with_replacement, 2)]
    epochs = UniformSampler(replacement=False, seed=7, consume_after=1)
    rest = drawn(two, epochs, 30)
    assert len(second) == 10 and len(rest) == 20
    assert sorted(first + second + rest) == list(range(50))
    assert epochs._flat_epoch is not None and epochs._epoch is None
    for sampler in (with_replacement, epochs):
        assert not len(sampler.spent_keys())  # nothing was refused: nothing spent was drawn
    assert not one.storage.index.entries and not two.storage.index.entries
    with pytest.raises(EmptyBufferError, match="consume_after=1"):
        drawn(two, epochs, 1)


def test_rows_spent_by_another_process_are_learned_not_refused_one_by_one(handles: Handles) -> None:
    """A sampler choosing over its key index learns the rows other processes spent (once a
    draw is refused, or its least likely rows were spent): its batches hold rows while
    unspent rows remain, every one of them in the end, then it runs dry (found by review:
    it returned 2, 2, then 0 rows with 6 unspent). A batch is shorter than asked when the
    sampler, drawing with replacement, drew a row twice."""
    one, two = handles
    one.store_batch(make_rows(200))
    mine = PrioritizedSampler(seed=0, consume_after=1)
    mine.flat = False  # over its key index (a draw over the key space probes the counts)
    got = drawn(one, mine, 4)
    spender = UniformSampler(replacement=False, seed=1, consume_after=1)
    spent = [i for _ in range(19) for i in drawn(two, spender, 10)]  # 190 of 200 rows
    assert len(set(spent)) == 190
    sizes = []
    with pytest.raises(EmptyBufferError, match="consume_after=1"):
        for _ in range(10):
            batch = drawn(one, mine, 4)
            sizes.append(len(batch))
            got += batch
    assert sum(sizes) == 200 - 190 - 4 + len(set(got[:4]) & set(spent))
    assert all(sizes)
    assert sorted(set(got) | set(spent)) == list(range(200))
    assert len(got) == len(set(got)) and not set(got[4:]) & set(spent)


def test_a_condition_nothing_matches_says_so_after_rows_were_spent(
    db_url: str, buffer_name: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(make_rows(40, agents=2))
        agent0 = QueryBuilder().eq("exp_meta.agent_id", "agent0").build()
        drawn(buffer, UniformSampler(replacement=False, seed=0, consume_after=1), 20, agent0)
        nobody = QueryBuilder().eq("exp_meta.agent_id", "agent9").build()
        with pytest.raises(EmptyBufferError, match="no rows match"):
            drawn(buffer, UniformSampler(seed=1, consume_after=1), 4, nobody)
        with pytest.raises(EmptyBufferError, match="consume_after=1"):
            drawn(buffer, UniformSampler(seed=2, consume_after=1), 4, agent0)


def test_a_chosen_row_deleted_before_its_draw_is_counted(
    handles: Handles, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process evicts a chosen row between the choice and the count: the count
    leaves it out (before, the counts' foreign key refused the whole batch, found by
    review)."""
    buffer, other = handles
    buffer.store_batch(make_rows(40))
    storage = buffer.storage
    count = storage.count_draws
    gone: list[int] = []

    def count_after_a_delete(keys, limit):  # noqa: ANN001, ANN202
        if not gone:
            victim = next(iter(other.query())).exp_data.state["i"]
            other.delete(QueryBuilder().eq("exp_data.state.i", victim).build())
            gone.append(victim)
        return count(keys, limit)

    monkeypatch.setattr(storage, "count_draws", count_after_a_delete)
    got = drawn(buffer, UniformSampler(replacement=False, seed=0, consume_after=1), 40)
    assert gone and gone[0] not in got
    assert sorted(got) == sorted(set(range(40)) - set(gone))


@pytest.mark.parametrize(
    "make",
    [
        lambda: UniformSampler(seed=0, consume_after=1),
        lambda: UniformSampler(replacement=False, seed=0, consume_after=1),
        lambda: PrioritizedSampler(seed=0, consume_after=1),
    ],
    ids=["uniform", "epochs", "prioritized"],
)
def test_a_batch_chosen_again_keeps_the_rows_it_counted(
    db_url: str, buffer_name: str, monkeypatch: pytest.MonkeyPatch, make
) -> None:
    """A batch that had to wait for its rate limit is chosen again; the rows it had
    counted stay in it (before, they were lost: with consume_after=1 never returned)."""
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(make_rows(40))
        storage = buffer.storage
        acquire = storage.acquire_samples
        waits = [True, False, True]

        def acquire_after_waits(n, since=None):  # noqa: ANN001, ANN202
            counted, waited = acquire(n, since=since)
            return counted, (waits.pop(0) if waits else waited)

        monkeypatch.setattr(storage, "acquire_samples", acquire_after_waits)
        sampler, got = make(), []
        with pytest.raises(EmptyBufferError):
            for _ in range(100):
                got += drawn(buffer, sampler, 8)
        assert sorted(got) == list(range(40))  # every row once, none lost to a wait


def test_rows_deleted_before_the_fetch_leave_the_others_owed(
    handles: Handles, monkeypatch: pytest.MonkeyPatch
) -> None:
    buffer, other = handles
    buffer.store_batch(make_rows(40))
    storage = buffer.storage
    fetch = storage.fetch
    gone: list[int] = []

    def fetch_after_a_delete(keys, paths=None, **kw):  # noqa: ANN001, ANN202
        if not gone:  # another process deletes the first chosen row
            row = other.storage.fetch_keys(keys[:1])[0]
            gone.append(row.exp_data.state["i"])
            other.delete(QueryBuilder().eq("id", row.id).build())
        return fetch(keys, paths, **kw)

    monkeypatch.setattr(storage, "fetch", fetch_after_a_delete)
    sampler, got = UniformSampler(seed=1, consume_after=1), []
    with pytest.raises(EmptyBufferError):
        for _ in range(100):
            got += drawn(buffer, sampler, 8)
    assert sorted(got) == sorted(set(range(40)) - set(gone))


def test_weights_of_a_batch_pieced_together_after_refusals(handles: Handles) -> None:
    """Rows refused (spent by another process since) are chosen again; each row of the
    batch keeps its own importance weight (before: another row's, or an IndexError)."""
    one, two = handles
    one.store_batch(make_rows(200))
    ids = [r.id for r in one.query()]
    priority = {row_id: float(k + 1) for k, row_id in enumerate(ids)}
    one.update_priorities(list(priority), list(priority.values()))
    sampler = PrioritizedSampler(seed=0, consume_after=1, alpha=1.0, beta=1.0)
    spender = UniformSampler(seed=1, consume_after=1)
    not_the_least = QueryBuilder().gt("exp_data.state.i", 0).build()  # min stays
    batches = 0
    with pytest.raises(EmptyBufferError):
        for _ in range(40):
            drawn(one, sampler, 8)
            info = sampler.last_info
            # (p_i / p_min) ** -beta: weight x priority is the same for every row
            scaled = info.weights * np.array([priority[i] for i in info.ids])
            np.testing.assert_allclose(scaled, scaled[0], rtol=1e-4)
            batches += 1
            try:
                drawn(two, spender, 30, not_the_least)
            except EmptyBufferError:
                pass
    assert batches > 3


def test_a_connection_lost_after_some_rows_were_counted_loses_none(
    handles: Handles, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second attempt of a consume_after choice (rows refused) loses its connection:
    the rows the first attempt counted stay owed (found by review: spent, never
    returned)."""
    one, two = handles
    one.store_batch(make_rows(100))
    mine, theirs = (
        UniformSampler(seed=1, consume_after=1),
        UniformSampler(seed=2, consume_after=1),
    )
    mine.flat = theirs.flat = False  # refusals: a key index that learns late
    got = drawn(one, mine, 10)
    got += drawn(two, theirs, 40)  # spent where mine does not know yet
    choose, calls = mine.choose, []

    def flaky(storage, batch_size, query_condition=None):  # noqa: ANN001, ANN202
        calls.append(batch_size)
        if len(calls) == 2:
            raise ConnectionLostError("the replica went away")
        return choose(storage, batch_size, query_condition)

    monkeypatch.setattr(mine, "choose", flaky)
    got += drawn(one, mine, 30)
    assert len(calls) >= 3  # refused, lost, chosen again
    monkeypatch.setattr(mine, "choose", choose)
    with pytest.raises(EmptyBufferError):
        for _ in range(20):
            got += drawn(one, mine, 30)
    assert sorted(got) == list(range(100))


def test_a_batch_that_waited_returns_no_more_rows_than_were_counted(
    db_url: str, buffer_name: str
) -> None:
    """The first choice is short (few rows left), the rate limit makes it wait while a
    writer stores more: the batch chosen again stays within what was counted against the
    limit (found by review: 29 rows returned, 14 counted)."""
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(make_rows(40))
        sampler = UniformSampler(seed=0, consume_after=1)
        drawn(buffer, sampler, 35)  # a few rows left
        buffer.set_rate_limiter(RateLimiter(min_size=1, samples_per_insert=1.0, timeout_s=30))
        acquire = buffer.storage.acquire_samples

        def acquire_while_a_writer_stores(n, since=None):  # noqa: ANN001, ANN202
            counted, waited = acquire(n, since=since)
            if not waited:  # as if it had waited for these rows
                buffer.store_batch(make_rows(100)[40:])
                waited = True
            return counted, waited

        buffer.storage.acquire_samples = acquire_while_a_writer_stores  # type: ignore[method-assign]
        got = drawn(buffer, sampler, 32)
        stats = buffer.rate_limit_stats()
        assert stats is not None and 0 < len(got) <= stats.sampled


def test_rows_owed_that_went_stale_during_a_wait_are_left_out(
    db_url: str, buffer_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        rows = make_rows(40)
        for i, row in enumerate(rows):
            row.exp_meta.policy_version = i // 20  # versions 0 and 1
        buffer.store_batch(rows)
        buffer.set_policy_version(1)
        acquire, waits = buffer.storage.acquire_samples, []

        def acquire_as_the_version_moves(n, since=None):  # noqa: ANN001, ANN202
            counted, waited = acquire(n, since=since)
            if not waits:
                waits.append(n)
                buffer.set_policy_version(2)  # every version-0 row goes stale
                waited = True
            return counted, waited

        monkeypatch.setattr(buffer.storage, "acquire_samples", acquire_as_the_version_moves)
        sampler = UniformSampler(seed=3, consume_after=1, max_staleness=1)
        batch = NumpyConverter({"v": "exp_meta.policy_version"})
        versions = buffer.sample(sampler, None, batch, 30)["v"].tolist()
        assert waits and set(versions) == {1}
