"""GRPO groups: GroupSampler draws whole, complete groups; filters run in SQL; group
claims consume whole groups once; GroupAdvantageConverter normalises within groups."""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest
from sqlalchemy.exc import OperationalError

from expstore import (
    GroupAdvantageConverter,
    GroupSampler,
    GroupStat,
    NumpyConverter,
    QueryBuilder,
    ReplayBuffer,
)
from expstore.errors import (
    EmptyBufferError,
    InvalidArgumentError,
    QueryError,
    StorageError,
    UnsupportedTypeError,
    WaitTimeoutError,
)
from tests.helpers import make_row
from tests.samplers.stats import chi_square_p


@pytest.fixture(autouse=True, params=["summaries", "key space"])
def group_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test with group draws over the summaries of every group (a buffer of up to
    1M rows) and over the key space where they can (a larger one)."""
    if request.param == "key space":
        monkeypatch.setattr(GroupSampler, "summaries_up_to", 0)
    return str(request.param)


def group(prompt: str, rewards: list[float], version: int | None = None, **data):
    """One prompt's rollouts: a row per completion (task = prompt, agent = completion)."""
    return [
        make_row(prompt, f"c{i}", 0, reward=r, version=version, **data)
        for i, r in enumerate(rewards)
    ]


def prompts_of(rows) -> list[str]:
    return [r.exp_meta.task_id for r in rows]


def test_batches_are_whole_groups_one_after_the_other(buf: ReplayBuffer) -> None:
    for p in range(6):
        buf.store_batch(group(f"p{p}", [0.0, 1.0, 0.5, 1.0]))
    sampler = GroupSampler(group_size=4, seed=0)
    rows = buf.sample(sampler, batch_size=12)
    assert len(rows) == 12
    blocks = [prompts_of(rows[i : i + 4]) for i in range(0, 12, 4)]
    assert all(len(set(b)) == 1 for b in blocks)
    assert len({b[0] for b in blocks}) == 3  # distinct groups in a batch
    for i in range(0, 12, 4):  # a group's rows in insertion order
        assert [r.exp_meta.agent_id for r in rows[i : i + 4]] == ["c0", "c1", "c2", "c3"]


def test_incomplete_groups_wait_until_complete(buf: ReplayBuffer) -> None:
    buf.store_batch(group("done", [0.0, 1.0]))
    buf.store_batch(group("partial", [0.0]))
    sampler = GroupSampler(group_size=2, seed=0)
    for _ in range(10):
        assert set(prompts_of(buf.sample(sampler, batch_size=4))) == {"done"}
    assert sampler.last_counts == (1, 1, 0, 0)
    buf.store(make_row("partial", "c1", 0, reward=1.0))  # completes it
    seen = Counter(p for _ in range(10) for p in prompts_of(buf.sample(sampler, batch_size=4)))
    assert seen == {"done": 20, "partial": 20}  # both groups in every batch of two groups


def test_a_batch_asking_for_more_groups_than_are_ready_has_all_of_them(
    buf: ReplayBuffer,
) -> None:
    buf.store_batch(group("a", [1, 2]) + group("b", [3, 4]))
    rows = buf.sample(GroupSampler(group_size=2, seed=0), batch_size=10)
    assert sorted(prompts_of(rows)) == ["a", "a", "b", "b"]
    again = buf.sample(GroupSampler(group_size=2, replacement=True, seed=0), batch_size=10)
    assert len(again) == 10


def test_rows_beyond_the_group_size_are_never_drawn(buf: ReplayBuffer) -> None:
    buf.store_batch(group("p", [0.0, 1.0, 2.0, 3.0, 4.0]))
    for _ in range(5):
        got = [r.exp_meta.agent_id for r in buf.sample(GroupSampler(group_size=3), batch_size=3)]
        assert got == ["c0", "c1", "c2"]


def test_varied_reward_drops_groups_whose_rewards_are_all_equal(buf: ReplayBuffer) -> None:
    buf.store_batch(group("all-right", [1.0, 1.0, 1.0]))
    buf.store_batch(group("all-wrong", [0.0, 0.0, 0.0]))
    buf.store_batch(group("mixed", [0.0, 1.0, 0.0]))
    sampler = GroupSampler(group_size=3, varied_reward=True, seed=0)
    for _ in range(10):
        assert set(prompts_of(buf.sample(sampler, batch_size=9))) == {"mixed"}
    assert sampler.last_counts.filtered == 2 and sampler.last_counts.ready == 1


def test_a_custom_group_condition_is_evaluated_by_the_database(buf: ReplayBuffer) -> None:
    buf.store_batch(group("easy", [1.0, 1.0, 0.5]))  # mean 0.83
    buf.store_batch(group("hard", [0.0, 0.0, 0.5]))  # mean 0.17
    buf.store_batch(group("medium", [0.0, 1.0, 0.5]))  # mean 0.5
    having = (GroupStat.mean("reward_t") < 0.8) & (GroupStat.max("exp_data.reward_t") >= 0.5)
    sampler = GroupSampler(group_size=3, having=having, seed=0)
    assert set(prompts_of(buf.sample(sampler, batch_size=30))) == {"hard", "medium"}
    either = (GroupStat.min("reward_t") >= 0.5) | (GroupStat.spread("reward_t") == 0.5)
    got = buf.sample(GroupSampler(group_size=3, having=either), batch_size=30)
    assert set(prompts_of(got)) == {"easy", "hard"}
    combined = GroupSampler(group_size=3, varied_reward=True, having=GroupStat.sum("reward_t") > 1)
    assert set(prompts_of(buf.sample(combined, batch_size=30))) == {"easy", "medium"}


def test_groups_are_drawn_uniformly(buf: ReplayBuffer) -> None:
    for p in range(5):
        buf.store_batch(group(f"p{p}", [0.0, 1.0]))
    sampler = GroupSampler(group_size=2, seed=3)
    counts = Counter()
    for _ in range(400):
        counts.update(prompts_of(buf.sample(sampler, batch_size=2))[:1])
    assert chi_square_p([counts[f"p{p}"] for p in range(5)], [1] * 5) > 1e-4


def _mixed_groups(buf: ReplayBuffer) -> list[str]:
    """12 ready groups of 4 (two with 12 rows beyond 4), and groups that are not ready:
    waiting, rewards all equal, stale; returns the ready ones."""
    ready = []
    for p in range(12):
        rewards = [0.0, 1.0, 0.5, 1.0] + ([1.0] * 12 if p % 6 == 0 else [])
        buf.store_batch(group(f"r{p}", rewards, version=5))
        ready.append(f"r{p}")
        if p % 3 == 0:
            buf.store_batch(group(f"wait{p}", [0.0, 1.0], version=5))
            buf.store_batch(group(f"same{p}", [1.0] * 4, version=5))
            buf.store_batch(group(f"old{p}", [0.0, 1.0, 0.0, 1.0], version=1))
    buf.set_policy_version(5)
    return ready


def test_groups_drawn_over_the_key_space_are_uniform_among_ready_groups(
    buf: ReplayBuffer,
) -> None:
    ready = _mixed_groups(buf)
    sampler = GroupSampler(group_size=4, varied_reward=True, max_staleness=2, seed=4)
    sampler.summaries_up_to = 0  # over the key space, as in a buffer of millions of rows
    counts: Counter[str] = Counter()
    for _ in range(300):
        rows = buf.sample(sampler, batch_size=12)
        blocks = [rows[i : i + 4] for i in range(0, 12, 4)]
        names = [prompts_of(b)[0] for b in blocks]
        assert len(set(names)) == 3  # distinct groups
        for b in blocks:  # whole groups, their first rows in insertion order
            assert len(set(prompts_of(b))) == 1
            assert [r.exp_meta.agent_id for r in b] == ["c0", "c1", "c2", "c3"]
        counts.update(names)
    assert not buf.storage.group_index.entries  # no summaries of every group were read
    assert set(counts) == set(ready)
    assert chi_square_p([counts[p] for p in ready], [1] * len(ready)) > 1e-4
    # counted by the database when asked for, as over the summaries, holding no summary
    assert sampler.last_counts == (12, 4, 4, 4)
    assert not buf.storage.group_index.entries
    buf.storage.group_index.clear()
    again = GroupSampler(group_size=4, varied_reward=True, max_staleness=2, replacement=True)
    again.summaries_up_to = 0
    assert set(prompts_of(buf.sample(again, batch_size=4 * 40))) <= set(ready)
    assert not buf.storage.group_index.entries


def test_a_batch_of_more_groups_than_are_ready_falls_back_to_the_summaries(
    buf: ReplayBuffer,
) -> None:
    ready = _mixed_groups(buf)
    sampler = GroupSampler(group_size=4, varied_reward=True, max_staleness=2, seed=5)
    sampler.summaries_up_to = 0
    rows = buf.sample(sampler, batch_size=4 * 20)
    assert sorted(set(prompts_of(rows))) == sorted(ready) and len(rows) == 48
    assert buf.storage.group_index.entries


def test_groups_by_a_payload_path(buf: ReplayBuffer) -> None:
    rows = [
        make_row(f"t{i}", "a", 0, reward=float(i % 2), ext_info={"prompt": f"q{i // 2}"})
        for i in range(6)
    ]
    buf.store_batch(rows)
    by_prompt = GroupSampler("exp_data.ext_info.prompt", 2, seed=0)
    by_prompt.summaries_up_to = 0
    got = buf.sample(by_prompt, batch_size=6)
    prompts = [r.exp_data.ext_info["prompt"] for r in got]
    assert [prompts[i] == prompts[i + 1] for i in (0, 2, 4)] == [True] * 3
    assert sorted(set(prompts)) == ["q0", "q1", "q2"]
    # A payload path has no index to find a group's rows by: the summaries serve.
    assert buf.storage.group_index.entries


def test_a_groups_version_is_its_oldest_rows(buf: ReplayBuffer) -> None:
    old = [make_row("mixed", "c0", 0, reward=0.0, version=1)]
    old += [make_row("mixed", "c1", 0, reward=1.0, version=5)]
    buf.store_batch(old + group("new", [0.0, 1.0], version=5) + group("unversioned", [0, 1]))
    buf.set_policy_version(5)
    sampler = GroupSampler(group_size=2, max_staleness=2, seed=0)
    assert set(prompts_of(buf.sample(sampler, batch_size=10))) == {"new", "unversioned"}
    assert sampler.last_counts.stale == 1
    buf.set_policy_version(8)  # now "new" is stale too
    assert set(prompts_of(buf.sample(sampler, batch_size=10))) == {"unversioned"}


def test_nothing_ready_says_why(buf: ReplayBuffer) -> None:
    buf.store_batch(group("same", [1.0, 1.0]) + group("half", [0.0]))
    buf.store_batch(group("old", [0.0, 1.0], version=0))
    buf.set_policy_version(9)
    sampler = GroupSampler(group_size=2, varied_reward=True, max_staleness=1)
    with pytest.raises(EmptyBufferError, match=r"1 waiting for rows, 1 filtered out .* 1 older"):
        buf.sample(sampler, batch_size=2)


def test_summaries_follow_inserts_and_evictions_incrementally(buf: ReplayBuffer) -> None:
    for p in range(50):
        buf.store_batch(group(f"p{p}", [0.0, 1.0]))
    sampler = GroupSampler(group_size=2, seed=0)
    sampler.flat = False  # the summaries of every group, kept up to date
    buf.sample(sampler, batch_size=2)
    index = buf.storage.group_index
    assert index.groups_read == 50
    buf.store_batch(group("p50", [0.0]))
    buf.sample(sampler, batch_size=2)
    assert index.groups_read == 51  # only the touched group was summarised again
    assert sampler.last_counts.waiting == 1
    buf.store(make_row("p50", "c1", 0, reward=1.0))
    buf.sample(sampler, batch_size=2)
    assert index.groups_read == 52 and sampler.last_counts.ready == 51
    buf.set_retention(101)  # FIFO: p0 loses one row and waits (forever, in practice)
    buf.sample(sampler, batch_size=2)
    assert sampler.last_counts == (50, 1, 0, 0)
    buf.delete(QueryBuilder().eq("exp_meta.task_id", "p1").build())  # other deletes: all again
    buf.sample(sampler, batch_size=2)
    assert sampler.last_counts == (49, 1, 0, 0)


def test_a_condition_limits_the_rows_of_groups(buf: ReplayBuffer) -> None:
    buf.store_batch(group("p", [0.0, 1.0, 2.0]))
    cond = QueryBuilder().ne("exp_data.reward_t", 1.0).build()
    got = buf.sample(GroupSampler(group_size=2), cond, batch_size=2)
    assert [r.exp_data.reward_t for r in got] == [0.0, 2.0]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"group_size": 0}, InvalidArgumentError, "group_size must be an int >= 1"),
        ({"group_size": 2.5}, InvalidArgumentError, "group_size"),
        ({"group_by": "task_idd"}, QueryError, "task_idd"),
        ({"group_by": 3}, UnsupportedTypeError, "group_by"),
        ({"consume_after": 2}, InvalidArgumentError, "claims"),
        ({"having": "mean > 0"}, UnsupportedTypeError, "GroupStat"),
    ],
)
def test_bad_group_arguments_are_refused(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        GroupSampler(**kwargs)


def test_bad_group_statistics_are_refused() -> None:
    with pytest.raises(QueryError, match="numeric column"):
        GroupStat.mean("exp_data.state.score")
    with pytest.raises(QueryError, match="numeric column"):
        GroupStat.mean("task_id")
    with pytest.raises(UnsupportedTypeError, match="number"):
        GroupStat.mean("reward_t") > "x"  # noqa: B015
    with pytest.raises(QueryError, match="finite"):
        GroupStat.mean("reward_t") > float("nan")  # noqa: B015


def test_batch_size_must_be_whole_groups(buf: ReplayBuffer) -> None:
    buf.store_batch(group("p", [0.0, 1.0]))
    with pytest.raises(InvalidArgumentError, match="multiple of 2"):
        buf.sample(GroupSampler(group_size=2), batch_size=3)


# -- group advantages ----------------------------------------------------------------------
def test_group_advantages_are_normalised_within_each_group(buf: ReplayBuffer) -> None:
    rewards = {"a": [0.0, 1.0, 1.0, 0.0], "b": [2.0, 4.0, 6.0, 8.0]}
    for p, rs in rewards.items():
        buf.store_batch(group(p, rs))
    rows = buf.sample(GroupSampler(group_size=4, seed=0), None, GroupAdvantageConverter(), 8)
    for i in range(0, 8, 4):
        block = rows[i : i + 4]
        r = np.array([x.exp_data.reward_t for x in block])
        expected = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
        assert np.allclose([x.exp_data.adv_t for x in block], expected, atol=1e-6)
    assert buf.get(rows[0].id).exp_data.adv_t is None  # the stored row is unchanged


def test_group_advantages_in_a_dict_batch(buf: ReplayBuffer) -> None:
    buf.store_batch(group("a", [0.0, 2.0]) + group("b", [5.0, 5.0]))
    conv = GroupAdvantageConverter(NumpyConverter({"r": "exp_data.reward_t"}), scale=None)
    batch = buf.sample(GroupSampler(group_size=2, seed=0), None, conv, 4)
    assert batch["advantages"].dtype == np.float32
    assert sorted(batch["advantages"].tolist()) == [-1.0, 0.0, 0.0, 1.0]
    scaled = GroupAdvantageConverter(NumpyConverter({"r": "exp_data.reward_t"}))
    batch = buf.sample(GroupSampler(group_size=2, seed=0), None, scaled, 4)
    for i in (0, 2):
        if batch["r"][i] != batch["r"][i + 1]:
            assert np.allclose(sorted(batch["advantages"][i : i + 2]), [-0.7071, 0.7071], atol=1e-4)
        else:
            assert batch["advantages"][i] == 0.0


def test_group_advantages_need_rewards(buf: ReplayBuffer) -> None:
    buf.store_batch(group("a", [0.0, None]))  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentError, match="no reward"):
        buf.sample(GroupSampler(group_size=2), None, GroupAdvantageConverter(), 2)


# -- group claims --------------------------------------------------------------------------
def test_group_claims_take_whole_groups_once(buf: ReplayBuffer) -> None:
    for p in range(10):
        buf.store_batch(group(f"p{p}", [0.0, 1.0, 2.0]))
    buf.store_batch(group("partial", [0.0, 1.0]))
    seen: Counter[str] = Counter()
    for i in range(6):
        claim = buf.claim(6, consumer=f"c{i % 2}", order=GroupSampler(group_size=3, seed=i))
        prompts = prompts_of(claim.batch)
        assert len(prompts) % 3 == 0
        assert all(len(set(prompts[j : j + 3])) == 1 for j in range(0, len(prompts), 3))
        seen.update(prompts)
        claim.ack()
    assert seen == {f"p{p}": 3 for p in range(10)}  # every complete group, each once
    assert len(buf.claim(3, consumer="c0", order=GroupSampler(group_size=3))) == 0


def test_released_groups_come_back_whole(buf: ReplayBuffer) -> None:
    for p in range(3):
        buf.store_batch(group(f"p{p}", [0.0, 1.0]))
    sampler = GroupSampler(group_size=2, seed=0)
    first = buf.claim(6, consumer="a", order=sampler)
    assert len(first) == 6
    first.release()
    again = buf.claim(6, consumer="a", order=sampler)  # the same sampler saw them taken
    assert sorted(prompts_of(again.batch)) == ["p0", "p0", "p1", "p1", "p2", "p2"]


def test_a_group_with_a_row_claimed_alone_is_not_group_claimable(buf: ReplayBuffer) -> None:
    buf.store_batch(group("p0", [0.0, 1.0]) + group("p1", [0.0, 1.0]))
    single = buf.claim(1, consumer="rows")  # FIFO: p0's first row
    got = buf.claim(4, consumer="groups", order=GroupSampler(group_size=2, seed=0))
    assert prompts_of(got.batch) == ["p1", "p1"]
    single.release()
    rest = buf.claim(4, consumer="groups", order=GroupSampler(group_size=2, seed=0))
    assert prompts_of(rest.batch) == ["p0", "p0"]


def test_group_claims_with_varied_reward_and_staleness(buf: ReplayBuffer) -> None:
    buf.store_batch(group("flat", [1.0, 1.0], version=3))
    buf.store_batch(group("old", [0.0, 1.0], version=1))
    buf.store_batch(group("good", [0.0, 1.0], version=3))
    buf.set_policy_version(3)
    order = GroupSampler(group_size=2, varied_reward=True, max_staleness=1, seed=0)
    claim = buf.claim(6, consumer="c", order=order)
    assert prompts_of(claim.batch) == ["good", "good"]


def test_group_claims_need_whole_groups(buf: ReplayBuffer) -> None:
    buf.store_batch(group("p", [0.0, 1.0]))
    with pytest.raises(InvalidArgumentError, match="multiple of 2"):
        buf.claim(3, consumer="c", order=GroupSampler(group_size=2))


def test_concurrent_group_claimers_split_groups_whole_and_once(
    db_url: str, buffer_name: str
) -> None:
    import threading

    with ReplayBuffer(db_url, name=buffer_name) as setup:
        for p in range(40):
            setup.store_batch(group(f"p{p}", [0.0, 1.0, 2.0, 3.0]))
        # A row claimer competes for single rows meanwhile.
        setup.claim(5, consumer="rows", order="random")
    claims: list[list[str]] = []
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            with ReplayBuffer(db_url, name=buffer_name) as buffer:
                sampler = GroupSampler(group_size=4, seed=i)
                while True:
                    claim = buffer.claim(8, consumer=f"w{i}", order=sampler)
                    if not len(claim):
                        return
                    claims.append(prompts_of(claim.batch))
                    claim.ack()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    seen = Counter(p for c in claims for p in c)
    assert all(n == 4 for n in seen.values())  # whole groups, each claimed once
    for c in claims:
        assert all(len(set(c[j : j + 4])) == 1 for j in range(0, len(c), 4))
    assert len(seen) >= 40 - 5  # all but the groups the row claimer broke


def test_groups_much_longer_than_the_group_size(buf: ReplayBuffer) -> None:
    """Whole trajectories as groups (300 rows each, groups of 4): a draw over the key space
    reads each candidate's whole group, so it gives up within its budget of rows and the
    summaries serve; either way a group is its first 4 rows."""
    for t in range(6):
        buf.store_batch([make_row(f"t{t}", f"c{i}", i, reward=float(i % 2)) for i in range(300)])
    sampler = GroupSampler(group_size=4, seed=0)
    sampler.summaries_up_to = 0
    for _ in range(3):
        rows = buf.sample(sampler, batch_size=8)
        assert [r.exp_meta.step for r in rows] == [0, 1, 2, 3] * 2
        assert len(set(prompts_of(rows))) == 2


def test_a_group_claim_with_wait_waits_for_whole_groups(buf: ReplayBuffer) -> None:
    """Found by review: the wait counted claimable rows, so with only incomplete groups a
    claim with wait returned an empty claim at once."""
    buf.store_batch(group("p0", [0.0, 1.0]))  # 2 of 4 rows
    sampler = GroupSampler(group_size=4)
    with pytest.raises(WaitTimeoutError, match="no whole group of 4 rows"):
        buf.claim(4, consumer="c", order=sampler, wait_s=0.3)
    completes = threading.Timer(0.2, lambda: buf.store_batch(group("p0", [1.0, 0.0])))
    completes.start()
    claim = buf.claim(4, consumer="c", order=sampler, wait_s=10)
    completes.join()
    assert prompts_of(claim.batch) == ["p0"] * 4


def test_a_group_claim_retried_after_a_deadlock_takes_the_oldest_groups_once(
    buf: ReplayBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An attempt rolled back (a deadlock, then retried) leaves the ready-group index as it
    was: the retry takes the two oldest groups, the next claim the next two."""
    from expstore.claims.queue import ClaimQueue

    for p in range(10):
        buf.store_batch(group(f"p{p}", [0.0, 1.0]))
    enter, deadlocks = ClaimQueue.enter, [1]

    def enter_after_a_deadlock(self, conn, free, entry, stamps):  # noqa: ANN001, ANN202
        if deadlocks:
            deadlocks.pop()
            cause = OperationalError("UPDATE", {}, _Deadlock())
            raise StorageError("claim rows: deadlock detected") from cause
        return enter(self, conn, free, entry, stamps)

    monkeypatch.setattr(ClaimQueue, "enter", enter_after_a_deadlock)
    sampler = GroupSampler(group_size=2, seed=0)
    first = buf.claim(4, consumer="c", order=sampler)  # two groups, after one retry
    assert not deadlocks and prompts_of(first.batch) == ["p0", "p0", "p1", "p1"]
    second = buf.claim(4, consumer="c", order=sampler)
    assert prompts_of(second.batch) == ["p2", "p2", "p3", "p3"]
    assert sampler.last_counts == (6, 0, 0, 0)


def test_a_group_claim_whose_commit_fails_leaves_its_groups_claimable(
    buf: ReplayBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit that fails took none of the groups (the ready-group index moved in the
    same transaction): they stay claimable."""
    from sqlalchemy import event

    for p in range(4):
        buf.store_batch(group(f"p{p}", [0.0, 1.0]))
    engine = buf.sql.handle.connections.engine  # type: ignore[attr-defined]
    fails = [1]

    def fail_once(conn: object) -> None:
        if fails:
            fails.pop()
            raise OperationalError("COMMIT", {}, Exception("disk I/O error"))

    event.listen(engine, "commit", fail_once)
    sampler = GroupSampler(group_size=2, seed=0)
    try:
        with pytest.raises(StorageError):
            buf.claim(4, consumer="c", order=sampler)
    finally:
        event.remove(engine, "commit", fail_once)
    assert not fails
    claim = buf.claim(8, consumer="c", order=sampler)  # all four groups are still there
    assert sorted(set(prompts_of(claim.batch))) == ["p0", "p1", "p2", "p3"]
    assert buf.ready_groups(sampler) == (0, 4, 0, 0, 0)


class _Deadlock(Exception):
    sqlstate = "40P01"
