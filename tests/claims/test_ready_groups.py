"""The ready-group index of group claims: a claim costs what changed since the last one,
whatever was consumed before; groups come and go with writes, acks, leases, deletes,
eviction and policy versions exactly as the claims' promises say, on both backends."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import Counter
from typing import Any

import pytest

from expstore import GroupSampler, QueryBuilder, ReplayBuffer
from expstore.claims.ready_groups import ready_groups_of
from expstore.errors import InvalidArgumentError
from tests.helpers import make_row, run_out

#: Seconds the writers-and-claimers soak runs per backend (the issue asks for a minute).
SOAK_S = float(os.environ.get("EXPSTORE_GROUP_SOAK_S", "60"))


def group(prompt: str, rewards: list[float], version: int | None = None) -> list[Any]:
    return [make_row(prompt, f"c{i}", i, reward=r, version=version) for i, r in enumerate(rewards)]


def prompts(rows: Any) -> list[str]:
    return [r.exp_meta.task_id for r in rows]


def firsts(rows: Any, size: int) -> list[str]:
    names = prompts(rows)
    return [names[i] for i in range(0, len(names), size)]


def test_a_group_claim_on_the_default_in_memory_buffer() -> None:
    """Found by a user: ``ReplayBuffer()`` then a group claim raised "cannot start a
    transaction within a transaction"."""
    buffer = ReplayBuffer()
    for p in range(4):
        buffer.store_batch(group(f"p{p}", [0.0, 1.0, 0.0, 1.0]))
    claim = buffer.claim(8, consumer="grpo", order=GroupSampler("task_id", group_size=4))
    assert prompts(claim.batch) == ["p0"] * 4 + ["p1"] * 4
    assert claim.ack() == 8
    assert buffer.ready_groups(GroupSampler("task_id", group_size=4)).ready == 2


def test_claims_take_the_oldest_complete_groups_first(buffer: ReplayBuffer) -> None:
    buffer.store_batch(group("late-start", [0.0]))  # completes last
    for p in range(5):
        buffer.store_batch(group(f"p{p}", [0.0, 1.0]))
    buffer.store_batch(group("late-start", [1.0]))
    sampler = GroupSampler(group_size=2)
    taken = []
    while claim := buffer.claim(4, consumer="c", order=sampler):
        taken += firsts(claim.batch, 2)
        claim.ack()
    # By first row: the group that began first is the oldest, though it completed last.
    assert taken == ["late-start", "p0", "p1", "p2", "p3", "p4"]


def test_random_order_takes_every_group_once(buffer: ReplayBuffer) -> None:
    for p in range(30):
        buffer.store_batch(group(f"p{p}", [0.0, 1.0]))
    sampler = GroupSampler(group_size=2, claim_order="random", seed=0)
    taken = []
    while claim := buffer.claim(6, consumer="c", order=sampler):
        taken += firsts(claim.batch, 2)
        claim.ack()
    assert sorted(taken) == sorted(f"p{p}" for p in range(30))
    assert taken != [f"p{p}" for p in range(30)]  # not oldest first
    with pytest.raises(InvalidArgumentError, match="claim_order"):
        GroupSampler(group_size=2, claim_order="newest")  # type: ignore[arg-type]


def test_a_claim_summarises_only_the_groups_written_since_the_last_one(
    buffer: ReplayBuffer,
) -> None:
    """The cost does not grow with consumed history: after 60 groups were claimed and
    acked, a claim reads the two groups written since, not the 62 of the buffer."""
    sampler = GroupSampler(group_size=4)
    for p in range(60):
        buffer.store_batch(group(f"h{p}", [0.0, 1.0, 0.0, 1.0]))
    while claim := buffer.claim(40, consumer="c", order=sampler):
        claim.ack()
    index = ready_groups_of(buffer.sql.handle)
    for p in range(2):
        buffer.store_batch(group(f"new{p}", [0.0, 1.0, 0.0, 1.0]))
    before = index.groups_read
    claim = buffer.claim(8, consumer="c", order=sampler)
    assert index.groups_read - before == 2
    assert firsts(claim.batch, 4) == ["new0", "new1"]
    # Only the two groups left in the index, then none: consumed groups are gone from it.
    claim.ack()
    assert buffer.ready_groups(sampler) == (0, 0, 0, 0, 0)


def test_waiting_groups_become_ready_when_their_last_row_comes(buffer: ReplayBuffer) -> None:
    sampler = GroupSampler(group_size=3)
    buffer.store_batch(group("p", [0.0, 1.0]))
    assert not buffer.claim(3, consumer="c", order=sampler)
    assert buffer.ready_groups(sampler) == (0, 0, 1, 0, 0)
    buffer.store_batch([make_row("p", "c2", 2, reward=0.5)])
    claim = buffer.claim(3, consumer="c", order=sampler)
    assert prompts(claim.batch) == ["p"] * 3


def test_filtered_groups_are_counted_once_and_never_claimed(buffer: ReplayBuffer) -> None:
    sampler = GroupSampler(group_size=2, varied_reward=True)
    buffer.store_batch(group("same", [1.0, 1.0]))
    buffer.store_batch(group("varied", [0.0, 1.0]))
    claim = buffer.claim(4, consumer="c", order=sampler)
    assert prompts(claim.batch) == ["varied", "varied"]
    buffer.store_batch([make_row("same", "c9", 9, reward=0.0)])  # a row past the group size
    counts = buffer.ready_groups(sampler)
    assert (counts.ready, counts.held, counts.filtered) == (0, 1, 1)
    assert sampler.last_counts == (0, 0, 1, 0)


def test_held_groups_come_back_on_release_and_when_the_lease_runs_out(
    buffer: ReplayBuffer,
) -> None:
    sampler = GroupSampler(group_size=2)
    for p in range(2):
        buffer.store_batch(group(f"p{p}", [0.0, 1.0]))
    first = buffer.claim(2, consumer="a", order=sampler)
    second = buffer.claim(2, consumer="b", order=sampler, lease_s=60)
    assert (firsts(first.batch, 2), firsts(second.batch, 2)) == (["p0"], ["p1"])
    assert not buffer.claim(2, consumer="c", order=sampler)
    first.release()
    run_out(buffer, second)  # the second lease runs out (by the database's clock)
    again = buffer.claim(4, consumer="c", order=sampler)
    assert firsts(again.batch, 2) == ["p0", "p1"]
    assert again.ack() == 4


def test_a_row_claim_of_a_groups_rows_keeps_the_group_out_until_free(
    buffer: ReplayBuffer,
) -> None:
    sampler = GroupSampler(group_size=2)
    buffer.store_batch(group("p0", [0.0, 1.0]))
    buffer.store_batch(group("p1", [0.0, 1.0]))
    rows = buffer.claim(
        1, consumer="rows", query_condition=QueryBuilder().eq("exp_meta.agent_id", "c1").build()
    )
    assert prompts(rows.batch) == ["p0"]  # the second row of p0
    assert firsts(buffer.claim(4, consumer="g", order=sampler).batch, 2) == ["p1"]
    rows.ack()  # p0 can never be claimed whole now
    assert not buffer.claim(2, consumer="g", order=sampler)


def test_stale_groups_leave_and_a_version_forced_back_brings_them_back(
    buffer: ReplayBuffer,
) -> None:
    sampler = GroupSampler(group_size=2, max_staleness=1)
    buffer.set_policy_version(0)
    buffer.store_batch(group("old", [0.0, 1.0], version=0))
    buffer.store_batch(group("mid", [0.0, 1.0], version=1))
    assert buffer.ready_groups(sampler).ready == 2
    buffer.set_policy_version(2)
    counts = buffer.ready_groups(sampler)
    assert (counts.ready, counts.stale) == (1, 1)
    claim = buffer.claim(4, consumer="c", order=sampler)
    assert prompts(claim.batch) == ["mid", "mid"]
    claim.release()
    buffer.set_policy_version(0, force=True)
    assert buffer.ready_groups(sampler) == (2, 0, 0, 0, 0)
    # A group stale when it completes is counted stale at once.
    buffer.set_policy_version(5)
    buffer.store_batch(group("late", [0.0, 1.0], version=1))
    assert buffer.ready_groups(sampler).stale == 3


def test_a_claims_max_staleness_with_the_samplers_is_an_index_of_its_own(
    buffer: ReplayBuffer,
) -> None:
    sampler = GroupSampler(group_size=2)
    buffer.set_policy_version(0)
    buffer.store_batch(group("old", [0.0, 1.0], version=0))
    buffer.store_batch(group("new", [0.0, 1.0], version=3))
    buffer.set_policy_version(3)
    assert firsts(buffer.claim(4, consumer="c", order=sampler, max_staleness=1).batch, 2) == ["new"]
    assert firsts(buffer.claim(4, consumer="c", order=sampler).batch, 2) == ["old"]


def test_deletes_and_eviction_keep_the_index_exact(db_url: str, buffer_name: str) -> None:
    sampler = GroupSampler(group_size=2)
    with ReplayBuffer(db_url, name=buffer_name, capacity=8) as buffer:
        for p in range(4):
            buffer.store_batch(group(f"p{p}", [0.0, 1.0]))
        assert buffer.ready_groups(sampler).ready == 4
        # A row of p1 deleted: p1 is incomplete now; p2 gets a third row, then loses its
        # second: its first two rows are its rows 1 and 3 now.
        buffer.store_batch([make_row("p2", "c9", 9, reward=0.5)])  # FIFO evicts p0's first
        buffer.delete(
            QueryBuilder().eq("exp_meta.task_id", "p1").and_().eq("exp_meta.agent_id", "c1").build()
        )
        buffer.delete(
            QueryBuilder().eq("exp_meta.task_id", "p2").and_().eq("exp_meta.agent_id", "c1").build()
        )
        claim = buffer.claim(8, consumer="c", order=sampler)
        assert [(r.exp_meta.task_id, r.exp_meta.agent_id) for r in claim.batch] == [
            ("p2", "c0"),
            ("p2", "c9"),
            ("p3", "c0"),
            ("p3", "c1"),
        ]
        # p1 and p0 (FIFO took its first row): one row each, waiting for another
        assert buffer.ready_groups(sampler).waiting == 2


def _writer(url: str, name: str, index: int, groups: int, size: int) -> None:
    with ReplayBuffer(url, name=name) as buffer:
        for g in range(groups):
            rows = [make_row(f"w{index}-{g}", f"c{i}", i, reward=float(i % 2)) for i in range(size)]
            # Half the groups in two writes: a claimer may see them in part.
            if g % 2:
                buffer.store_batch(rows[: size // 2])
                buffer.store_batch(rows[size // 2 :])
            else:
                buffer.store_batch(rows)


def _claimer(url: str, name: str, index: int, size: int, seconds: float, out: Any) -> None:
    taken: list[list[str]] = []
    sampler = GroupSampler(group_size=size, claim_order="random" if index else "oldest")
    with ReplayBuffer(url, name=name) as buffer:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            claim = buffer.claim(4 * size, consumer=f"g{index}", order=sampler)
            if claim:
                taken.append(prompts(claim.batch))
                claim.ack()
            else:
                time.sleep(0.01)
    out.put(taken)


@pytest.mark.slow
def test_four_writers_and_two_group_claimers_never_split_or_repeat_a_group(
    db_url: str, buffer_name: str
) -> None:
    """For SOAK_S seconds (a minute by default) per backend, in processes of their own."""
    size = 4
    with ReplayBuffer(db_url, name=buffer_name):
        pass
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    groups = 100_000  # more than the writers can write in the time; they are stopped
    writers = [
        context.Process(target=_writer, args=(db_url, buffer_name, i, groups, size))
        for i in range(4)
    ]
    claimers = [
        context.Process(target=_claimer, args=(db_url, buffer_name, i, size, SOAK_S, out))
        for i in range(2)
    ]
    for p in writers + claimers:
        p.start()
    results = [out.get(timeout=SOAK_S + 120) for _ in claimers]
    for p in writers:
        p.kill()
    for p in writers + claimers:
        p.join()
    claims = [c for taken in results for c in taken]
    seen = Counter(name for c in claims for name in c)
    assert claims and all(n == size for n in seen.values())  # whole groups, each once
    for c in claims:
        assert all(len(set(c[j : j + size])) == 1 for j in range(0, len(c), size))
    # Every complete group written before the last claim was claimed (none left behind).
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        left = buffer.ready_groups(GroupSampler(group_size=size))
        stats = buffer.queue_stats()
    assert stats.leased == 0
    assert left.held == 0


def test_groups_the_condition_refuses_do_not_hold_writers_back(buffer: ReplayBuffer) -> None:
    """Found by a user: under ``block_writers`` the rows of groups whose rewards are all
    equal counted as inserted but could never be sampled, so writers blocked for ever. A
    group claim's index counts them as discarded: the writer writes all its groups."""
    import threading

    from expstore import RateLimiter

    buffer.set_rate_limiter(
        RateLimiter(
            min_size=8, samples_per_insert=1.0, error_buffer=16, block_writers=True, timeout_s=30
        )
    )
    sampler = GroupSampler(group_size=4, varied_reward=True)
    written: list[BaseException | None] = []

    def write() -> None:
        try:
            for g in range(30):  # every other group refused: 60 rows never drawable
                rewards = [1.0, 1.0, 1.0, 1.0] if g % 2 else [0.0, 1.0, 0.0, 1.0]
                buffer.store_batch(group(f"g{g}", rewards))
            written.append(None)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            written.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    taken: list[str] = []
    while writer.is_alive() or buffer.ready_groups(sampler).ready:
        claim = (
            buffer.claim(8, consumer="learner", order=sampler, wait_s=0.5, min_batch_size=4)
            if (buffer.ready_groups(sampler).ready)
            else None
        )
        if claim is not None:
            taken += firsts(claim.batch, 4)
            claim.ack()
        else:
            time.sleep(0.02)
    writer.join()
    assert written == [None]
    assert sorted(taken) == sorted(f"g{g}" for g in range(0, 30, 2))
    stats = buffer.rate_limit_stats()
    assert stats is not None and stats.discarded == 60


def test_groups_a_row_claim_consumed_in_part_leave_the_index(buffer: ReplayBuffer) -> None:
    """Found by review: a row claim that acked the second row of 20 groups left their
    entries "ready" for ever; oldest first, they crowded out the groups written after."""
    sampler = GroupSampler(group_size=2)
    for p in range(20):
        buffer.store_batch(group(f"old{p}", [0.0, 1.0]))
    second_rows = QueryBuilder().eq("exp_meta.agent_id", "c1").build()
    buffer.claim(20, second_rows, consumer="rows").ack()
    for p in range(3):
        buffer.store_batch(group(f"new{p}", [0.0, 1.0]))
    claim = buffer.claim(6, consumer="g", order=sampler)
    assert firsts(claim.batch, 2) == ["new0", "new1", "new2"]
    claim.ack()
    assert buffer.ready_groups(sampler).ready == 0


def test_rows_left_out_by_several_indexes_are_discarded_once(buffer: ReplayBuffer) -> None:
    """Found by review: each index (condition, spec, staleness) discarded the groups it
    left out, so three of them counted the same rows three times."""
    from expstore import RateLimiter

    buffer.set_rate_limiter(RateLimiter(min_size=1, samples_per_insert=1.0, error_buffer=100))
    for p in range(8):
        buffer.store_batch(group(f"same{p}", [1.0, 1.0]))
    buffer.store_batch(group("varied", [0.0, 1.0]))
    for staleness in (None, 1, 2):
        counts = buffer.ready_groups(
            GroupSampler(group_size=2, varied_reward=True), max_staleness=staleness
        )
        assert (counts.ready, counts.filtered) == (1, 8)
    stats = buffer.rate_limit_stats()
    assert stats is not None and (stats.inserted, stats.discarded) == (18, 16)


def test_a_group_that_loses_its_first_row_but_keeps_enough_stays_claimable(
    buffer: ReplayBuffer,
) -> None:
    """Found by review: the entry went with its first row, and the group (3 rows, groups
    of 2) was never entered again though it still had two rows."""
    sampler = GroupSampler(group_size=2)
    buffer.store_batch(group("p", [0.0, 1.0, 0.5]))
    assert buffer.ready_groups(sampler).ready == 1
    buffer.delete(QueryBuilder().eq("exp_meta.agent_id", "c0").build())
    claim = buffer.claim(2, consumer="c", order=sampler)
    assert [r.exp_meta.agent_id for r in claim.batch] == ["c1", "c2"]


def test_a_version_forced_back_counts_the_groups_left_out_afresh(buffer: ReplayBuffer) -> None:
    sampler = GroupSampler(group_size=2, varied_reward=True, max_staleness=0)
    buffer.set_policy_version(1)
    for p in range(3):
        buffer.store_batch(group(f"same{p}", [1.0, 1.0], version=1))
    buffer.store_batch(group("ok", [0.0, 1.0], version=1))
    assert buffer.ready_groups(sampler) == (1, 0, 0, 3, 0)
    buffer.set_policy_version(2)
    assert buffer.ready_groups(sampler) == (0, 0, 0, 3, 1)
    buffer.set_policy_version(1, force=True)
    assert buffer.ready_groups(sampler) == (1, 0, 0, 3, 0)


def test_a_consumer_claims_whole_groups_with_min_n(buffer: ReplayBuffer) -> None:
    sampler = GroupSampler(group_size=2)
    learner = buffer.consumer("learner")
    buffer.store_batch(group("p0", [0.0, 1.0]))
    claim = learner.claim(8, order=sampler, wait_s=5, min_batch_size=2)
    assert prompts(claim.batch) == ["p0", "p0"]


@pytest.mark.parametrize("indexed", [False, True])
def test_groups_by_a_payload_path_with_and_without_its_index(
    buffer: ReplayBuffer, indexed: bool
) -> None:
    """A path index serves the catch-up of groups by that path (it asks for the touched
    groups as an ``in`` condition too); values of mixed kinds keep the text comparison."""
    from expstore import DataRow, Experience, ExpMeta

    if indexed:
        buffer.create_index("exp_data.ext_info.prompt_id")

    def rows(prompt: Any, n: int = 2) -> list[DataRow]:
        return [
            DataRow(
                exp_meta=ExpMeta(task_id=f"t{prompt}-{i}", agent_id=f"c{i}", step=i),
                exp_data=Experience(reward_t=float(i), ext_info={"prompt_id": prompt}),
            )
            for i in range(n)
        ]

    sampler = GroupSampler("exp_data.ext_info.prompt_id", group_size=2)
    for prompt in ("a", 7, 2.5, "7"):  # "7" and 7 are two groups
        buffer.store_batch(rows(prompt, 1))
    assert buffer.ready_groups(sampler).waiting == 4
    for prompt in ("a", 7, 2.5, "7"):
        buffer.store_batch(rows(prompt, 1))
    claim = buffer.claim(8, consumer="c", order=sampler)
    got = [r.exp_data.ext_info["prompt_id"] for r in claim.batch]
    assert got == ["a", "a", 7, 7, 2.5, 2.5, "7", "7"]
    assert [type(v) for v in got[2::2]] == [int, float, str]
