"""buffer.track_changes(path): changed()/unchanged() read flags kept by every write and
removal, and answer exactly what the correlated probe answers on an untracked twin (small
arrays aside, which the probe cannot see: those against a Python model)."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from expstore import ReplayBuffer
from expstore.db.schema import rows
from expstore.errors import EmptyBufferError, InvalidArgumentError
from expstore.query import Condition, QueryBuilder, to_sql
from expstore.samplers import StratifiedSampler, UniformSampler
from tests.helpers import killed_actor, make_row
from tests.query.changes_actor import rows_for

RNG = np.random.default_rng(5)
PAGES = [RNG.integers(0, 255, (160, 160, 3), dtype=np.uint8) for _ in range(3)]  # by digest
SMALL = [np.full(3, p, np.int32) for p in range(3)]  # in the row's blob
FIELDS = ("exp_data.state.screen", "exp_data.state.url", "exp_data.state.small", "agent_id")
PROBED = ("exp_data.state.screen", "exp_data.state.url", "agent_id")  # the probe sees these


def _row(task: str, step: int, page: int, reward: float = 0.0) -> Any:
    return make_row(
        task,
        f"a{page % 2}",
        step,
        reward=reward,
        state={"screen": PAGES[page], "url": f"u{page}", "small": SMALL[page]},
    )


def _answers(buffer: ReplayBuffer, fields: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in fields:
        for towards in ("previous", "next"):
            for changed in (True, False):
                built = QueryBuilder()
                built = (built.changed if changed else built.unchanged)(field, towards).build()
                out[f"{built}"] = (
                    sorted(r.id for r in buffer.query(built)),
                    buffer.count(built),
                )
    return out


def _model(buffer: ReplayBuffer, field: str) -> dict[str, Any]:
    """What changed()/unchanged() on ``field`` (the state's "small" array) should answer,
    computed in Python from the rows as stored (in key order)."""
    stored = list(buffer.query(None, order_by="key"))
    by_task: dict[str, list[tuple[int, int, Any]]] = {}
    for key, r in enumerate(stored):
        by_task.setdefault(r.exp_meta.task_id, []).append((r.exp_meta.step, key, r))
    same: dict[str, dict[str, bool]] = {"previous": {}, "next": {}}
    for mine in by_task.values():
        mine.sort(key=lambda x: (x[0], x[1]))
        for step, _, r in mine:
            below = [x for x in mine if x[0] < step]
            above = [x for x in mine if x[0] > step]
            value = r.exp_data.state["small"]
            same["previous"][r.id] = bool(below) and np.array_equal(
                below[-1][2].exp_data.state["small"], value
            )
            same["next"][r.id] = bool(above) and np.array_equal(
                above[0][2].exp_data.state["small"], value
            )
    out: dict[str, Any] = {}
    for towards in ("previous", "next"):
        for changed in (True, False):
            built = QueryBuilder()
            built = (built.changed if changed else built.unchanged)(field, towards).build()
            ids = sorted(i for i, s in same[towards].items() if s != changed)
            out[f"{built}"] = (ids, len(ids))
    return out


def _check(tracked: ReplayBuffer, twin: ReplayBuffer) -> None:
    assert sorted(r.id for r in tracked.query(None)) == sorted(r.id for r in twin.query(None))
    assert _answers(tracked, PROBED) == _answers(twin, PROBED)
    assert _answers(tracked, ("exp_data.state.small",)) == _model(tracked, "exp_data.state.small")


_rows = st.lists(
    st.tuples(
        st.sampled_from(["A", "B"]),
        st.integers(0, 5),
        st.integers(0, 1),
        st.integers(0, 3),
    ),
    min_size=1,
    max_size=8,
)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("store"), _rows),
        st.tuples(st.just("delete_step"), st.integers(0, 5)),
        st.tuples(st.just("delete_task"), st.sampled_from(["A", "B"])),
        st.tuples(
            st.just("capacity"),
            st.tuples(st.integers(2, 12), st.sampled_from(["fifo", "max_reward", "task_fifo"])),
        ),
        st.tuples(st.just("unlimited"), st.none()),
        st.tuples(st.just("clear"), st.none()),
    ),
    min_size=2,
    max_size=8,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=_ops)
def test_tracked_flags_agree_with_the_probe_after_any_writes_and_removals(
    db_url: str, ops: list[tuple[str, Any]]
) -> None:
    name = f"tracked_{uuid.uuid4().hex[:8]}"
    with (
        ReplayBuffer(db_url, name=name) as tracked,
        ReplayBuffer(db_url, name=name + "_twin") as twin,
    ):
        try:
            for field in FIELDS:
                assert tracked.track_changes(field)
            for op, arg in ops:
                # the same rows (ids) in both buffers
                batch = [_row(t, s, p, float(r)) for t, s, p, r in arg] if op == "store" else []
                for buffer in (tracked, twin):
                    if op == "store":
                        buffer.store_batch(batch)
                    elif op == "delete_step":
                        buffer.delete(Condition.parse(f"step = {arg}"))
                    elif op == "delete_task":
                        buffer.delete(QueryBuilder().eq("task_id", arg).build())
                    elif op == "capacity":
                        buffer.set_retention(arg[0], arg[1])
                    elif op == "unlimited":
                        buffer.set_retention(None)
                    else:
                        buffer.clear()
                _check(tracked, twin)
        finally:
            tracked.clear()
            twin.clear()


def test_small_arrays_compare_by_value_once_tracked(buffer: ReplayBuffer) -> None:
    pages = [0, 0, 1, 1, 1, 2, 0]
    buffer.store_batch([_row("A", s, p) for s, p in enumerate(pages)])
    unchanged = Condition.parse("unchanged(exp_data.state.small)")
    assert buffer.count(unchanged) == 0  # the probe cannot see them
    assert buffer.track_changes("exp_data.state.small") is True  # the rows stored: done now
    assert sorted(r.exp_meta.step for r in buffer.query(unchanged)) == [1, 3, 4]
    assert buffer.track_changes("exp_data.state.small") is False  # tracked already
    assert buffer.tracked_changes() == ["exp_data.state.small"]
    buffer.store_batch([_row("A", 7, 0), _row("A", 3, 1)])  # out of order, a tie at step 3
    assert sorted(r.exp_meta.step for r in buffer.query(unchanged)) == [1, 3, 3, 4, 7]
    assert buffer.untrack_changes("exp_data.state.small") is True
    assert buffer.count(unchanged) == 0
    assert buffer.untrack_changes("exp_data.state.small") is False
    assert buffer.tracked_changes() == []


def test_samplers_read_the_flags_of_the_keys_they_probe(buffer: ReplayBuffer) -> None:
    buffer.track_changes("exp_data.state.screen")
    pages = [0, 0, 1, 1, 2, 2, 2, 0]
    buffer.store_batch([_row(t, s, p) for t in "AB" for s, p in enumerate(pages)])
    unchanged = Condition.parse("unchanged(exp_data.state.screen)")
    wanted = {(t, s) for t in "AB" for s in (1, 3, 5, 6)}
    batch = buffer.sample(UniformSampler(seed=0), unchanged, batch_size=64)
    assert {(r.exp_meta.task_id, r.exp_meta.step) for r in batch} == wanted
    claim = buffer.claim(20, unchanged, consumer="learner")
    assert {(r.exp_meta.task_id, r.exp_meta.step) for r in claim.batch} == wanted
    claim.ack()


def test_another_handle_follows_tracking_and_untracking(db_url: str, buffer_name: str) -> None:
    with (
        ReplayBuffer(db_url, name=buffer_name) as one,
        ReplayBuffer(db_url, name=buffer_name) as other,
    ):
        one.store_batch([_row("A", s, p) for s, p in enumerate([0, 0, 1, 1])])
        unchanged = Condition.parse("unchanged(exp_data.state.small)")
        assert other.count(unchanged) == 0
        one.track_changes("exp_data.state.small")
        if db_url.startswith("sqlite:///") or db_url.startswith("postgresql"):
            assert other.count(unchanged) == 2
        one.untrack_changes("exp_data.state.small")
        assert other.count(unchanged) == 0
        one.clear()


@pytest.mark.parametrize(
    "path",
    ["nosuch", "exp_data.nosuch.x", "exp_meta.nosuch", "", 7, 'exp_data.state."q"'],
)
def test_tracking_a_path_that_is_not_a_field_is_refused(buffer: ReplayBuffer, path: Any) -> None:
    buffer.store_batch([_row("A", s, p) for s, p in enumerate([0, 0, 1])])
    unchanged = Condition.parse("unchanged(exp_data.state.url)")
    before = buffer.count(unchanged)
    with pytest.raises(InvalidArgumentError, match="cannot track changes of .*Nothing was changed"):
        buffer.track_changes(path)
    with pytest.raises(InvalidArgumentError, match="cannot track changes of"):
        buffer.untrack_changes(path)
    assert buffer.sql.tracked_changes() == []
    assert buffer.count(unchanged) == before == 1


def test_a_removed_step_s_neighbours_compare_with_the_steps_beyond_it(
    buffer: ReplayBuffer,
) -> None:
    buffer.track_changes("exp_data.state.screen")
    buffer.store_batch([_row("A", s, p) for s, p in enumerate([0, 1, 0, 2, 2])])
    unchanged = Condition.parse("unchanged(exp_data.state.screen)")
    unchanged_next = Condition.parse("unchanged(exp_data.state.screen, next)")
    assert sorted(r.exp_meta.step for r in buffer.query(unchanged)) == [4]
    buffer.delete(Condition.parse("step = 1"))
    assert sorted(r.exp_meta.step for r in buffer.query(unchanged)) == [2, 4]
    assert sorted(r.exp_meta.step for r in buffer.query(unchanged_next)) == [0, 3]
    buffer.set_retention(2, "fifo")  # steps 0 and 2 go: 3 is the first step now
    assert sorted(r.exp_meta.step for r in buffer.query(unchanged)) == [4]
    assert sorted(r.exp_meta.step for r in buffer.query(unchanged_next)) == [3]


def _probed(buffer: ReplayBuffer, condition: Condition) -> list[str]:
    """The ids the correlated probe finds (the flags left aside)."""
    handle = buffer.sql.handle
    where = to_sql(condition, rows, handle.dialect.name)
    stmt = select(rows.c.id).where(rows.c.buffer_id == handle.buffer_id, where)
    with handle.read() as conn:
        return sorted(conn.execute(stmt).scalars())


@pytest.mark.parametrize(
    "point", ["before-flags", "after-flags", "before-refresh", "after-refresh"]
)
def test_a_writer_killed_inside_its_write_leaves_the_flags_of_the_last_commit(
    db_url: str, buffer_name: str, point: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name, capacity=8) as buffer:
        buffer.track_changes("exp_data.state.url")
    killed_actor("tests.query.changes_actor", db_url, buffer_name, point)
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        assert buffer.count() == 8  # the second write's eviction, committed
        for text in (
            "changed(exp_data.state.url)",
            "unchanged(exp_data.state.url)",
            "changed(exp_data.state.url, next)",
            "unchanged(exp_data.state.url, next)",
        ):
            condition = Condition.parse(text)
            assert sorted(r.id for r in buffer.query(condition)) == _probed(buffer, condition)
        buffer.store_batch(rows_for(2))  # and it goes on, exact
        for text in ("unchanged(exp_data.state.url)", "unchanged(exp_data.state.url, next)"):
            condition = Condition.parse(text)
            assert sorted(r.id for r in buffer.query(condition)) == _probed(buffer, condition)


def test_every_write_path_keeps_the_flags(db_url: str, buffer_name: str) -> None:
    """extend (columns), and an ack that stores completions into a tracked buffer."""
    with (
        ReplayBuffer(db_url, name=buffer_name) as rollouts,
        ReplayBuffer(db_url, name=buffer_name + "_prompts") as prompts,
    ):
        rollouts.track_changes("exp_data.state.small")
        rollouts.track_changes("exp_data.state.url")
        for step, page in enumerate([0, 0, 1, 1]):
            rollouts.extend(
                {
                    "task_id": ["E0", "E1"],
                    "agent_id": "w",
                    "step": step,
                    "state": {"small": np.stack([SMALL[page]] * 2), "url": [f"u{page}"] * 2},
                }
            )
        prompts.store_batch([make_row("p", "w", 0, state={"q": 1})])
        claim = prompts.claim(1, consumer="actor")
        claim.ack(produce=[_row("E0", 9, 1), _row("E0", 5, 1)], into=rollouts)
        small = Condition.parse("unchanged(exp_data.state.small)")
        url = Condition.parse("unchanged(exp_data.state.url)")
        got = sorted((r.exp_meta.task_id, r.exp_meta.step) for r in rollouts.query(small))
        assert got == [("E0", 1), ("E0", 3), ("E0", 5), ("E0", 9), ("E1", 1), ("E1", 3)]
        assert sorted(r.id for r in rollouts.query(url)) == _probed(rollouts, url)
        assert sorted(r.id for r in rollouts.query(small)) == sorted(
            r.id for r in rollouts.query(url)
        )


def test_a_sampler_of_another_handle_follows_untracking(db_url: str, buffer_name: str) -> None:
    with (
        ReplayBuffer(db_url, name=buffer_name) as one,
        ReplayBuffer(db_url, name=buffer_name) as other,
    ):
        one.track_changes("exp_data.state.small")
        one.store_batch([_row("A", s, p) for s, p in enumerate([0, 0, 1, 1])])
        unchanged = Condition.parse("unchanged(exp_data.state.small)")
        drawn = other.sample(UniformSampler(seed=0), unchanged, batch_size=8)
        assert {r.exp_meta.step for r in drawn} == {1, 3}
        one.untrack_changes("exp_data.state.small")  # the probe again: none is unchanged
        with pytest.raises(EmptyBufferError, match="no rows match"):
            other.sample(UniformSampler(seed=0), unchanged, batch_size=8)
        one.track_changes("exp_data.state.small")
        drawn = other.sample(UniformSampler(seed=0), unchanged, batch_size=8)
        assert {r.exp_meta.step for r in drawn} == {1, 3}


def test_each_path_keeps_its_own_bits_and_an_untracked_path_s_slot_is_cleared_for_reuse(
    buffer: ReplayBuffer,
) -> None:
    """Paths share the rows' change_flags, two bits each: tracking, untracking and tracking
    another in the freed slot never lets one path's flags answer for another's."""
    pages = [0, 0, 1, 1, 1, 2, 0]
    buffer.store_batch([_row("A", s, p) for s, p in enumerate(pages)])
    url_same = Condition.parse("unchanged(exp_data.state.url)")
    agent_same = Condition.parse("unchanged(agent_id)")
    probed = {c: buffer.count(c) for c in (url_same, agent_same)}
    mine = select(rows.c.change_flags).where(rows.c.buffer_id == buffer.sql.buffer_id)
    buffer.track_changes("exp_data.state.url")
    buffer.track_changes("agent_id")
    assert {c: buffer.count(c) for c in probed} == probed
    with buffer.sql.handle.connections.engine.connect() as conn:
        flags = sorted(conn.execute(mine).scalars())
    assert max(flags) > 3  # the second path's bits are above the first's
    buffer.untrack_changes("exp_data.state.url")
    assert buffer.count(url_same) == probed[url_same]  # by the probe again
    assert buffer.count(agent_same) == probed[agent_same]
    buffer.track_changes("exp_data.state.screen")  # takes the freed slot, cleared
    screen_same = Condition.parse("unchanged(exp_data.state.screen)")
    assert buffer.count(screen_same) == 3
    assert buffer.count(agent_same) == probed[agent_same]
    buffer.untrack_changes("exp_data.state.screen")
    buffer.untrack_changes("agent_id")
    with buffer.sql.handle.connections.engine.connect() as conn:
        assert set(conn.execute(mine).scalars()) == {0}


def test_a_buffer_tracks_at_most_31_paths_and_the_32nd_is_refused(buffer: ReplayBuffer) -> None:
    buffer.store_batch([make_row("A", "a", s, state={f"p{i}": s // 2 for i in range(32)})
                        for s in range(4)])  # fmt: skip
    for i in range(31):
        assert buffer.track_changes(f"exp_data.state.p{i}")
    with pytest.raises(InvalidArgumentError, match="tracks 31 paths already.*untrack_changes"):
        buffer.track_changes("exp_data.state.p31")
    assert len(buffer.sql.tracked_changes()) == 31
    last = Condition.parse("unchanged(exp_data.state.p30)")
    assert sorted(r.exp_meta.step for r in buffer.query(last)) == [1, 3]
    buffer.untrack_changes("exp_data.state.p0")
    assert buffer.track_changes("exp_data.state.p31")
    assert sorted(r.exp_meta.step for r in buffer.query(last)) == [1, 3]
    newest = Condition.parse("unchanged(exp_data.state.p31)")
    assert sorted(r.exp_meta.step for r in buffer.query(newest)) == [1, 3]


def test_statements_compiled_for_a_path_follow_its_slot_going_to_another_path(
    db_url: str, buffer_name: str
) -> None:
    """Another handle untracks X and tracks Y, which takes X's slot: this handle's
    statements compiled for unchanged(X) (a probe, a stratified draw's first match) are
    compiled again, never reading Y's bits as X's."""
    xs = [0, 0, 1, 1, 2, 2, 3, 3]  # unchanged(x): steps 1, 3, 5, 7 (agent a1)
    ys = [0, 1, 1, 2, 3, 3, 4, 4]  # unchanged(y): steps 2, 5, 7
    unchanged_x = Condition.parse("unchanged(exp_data.state.x)")
    with (
        ReplayBuffer(db_url, name=buffer_name) as one,
        ReplayBuffer(db_url, name=buffer_name) as other,
    ):
        one.store_batch([make_row("A", f"a{s % 2}", s, state={"x": xs[s], "y": ys[s]})
                         for s in range(8)])  # fmt: skip
        one.track_changes("exp_data.state.x")

        def first_a0(space: Any) -> Any:
            return space.first_matching("agent_id", "a0", space.min_key)

        assert other.sql.key_space(unchanged_x, first_a0) is None  # a0's steps all change
        batch = other.sample(
            StratifiedSampler(by="exp_meta.agent_id", seed=0), unchanged_x, batch_size=16
        )
        assert {r.exp_meta.step for r in batch} <= {1, 3, 5, 7}
        one.untrack_changes("exp_data.state.x")
        one.track_changes("exp_data.state.y")  # slot 0 again
        assert other.sql.key_space(unchanged_x, first_a0) is None  # by the probe now
        for seed in range(3):
            batch = other.sample(
                StratifiedSampler(by="exp_meta.agent_id", seed=seed), unchanged_x, batch_size=16
            )
            assert {r.exp_meta.step for r in batch} <= {1, 3, 5, 7}
        one.clear()


def test_a_claim_compiled_for_a_path_follows_its_slot_going_to_another_path(
    db_url: str, buffer_name: str
) -> None:
    """The same for a first-in-first-out claim (one statement compiled once per handle on
    Postgres): after another handle gives X's slot to Y, a claim of unchanged(X) never
    takes rows by Y's bits."""
    xs = [0, 0, 1, 1, 2, 2, 3, 3]  # unchanged(x): steps 1, 3, 5, 7
    ys = [0, 1, 1, 2, 3, 3, 4, 4]  # unchanged(y): steps 2, 5, 7
    unchanged_x = Condition.parse("unchanged(exp_data.state.x)")
    with (
        ReplayBuffer(db_url, name=buffer_name) as one,
        ReplayBuffer(db_url, name=buffer_name) as other,
    ):
        one.store_batch([make_row("A", "a", s, state={"x": xs[s], "y": ys[s]})
                         for s in range(8)])  # fmt: skip
        one.track_changes("exp_data.state.x")
        first = other.claim(1, unchanged_x, consumer="c1")
        assert [r.exp_meta.step for r in first.batch] == [1]
        first.release()
        one.untrack_changes("exp_data.state.x")
        one.track_changes("exp_data.state.y")  # slot 0 again
        claim = other.claim(8, unchanged_x, consumer="c2")
        assert sorted(r.exp_meta.step for r in claim.batch) == [1, 3, 5, 7]
        claim.release()
        one.clear()


def test_tracking_a_buffer_of_many_tasks_sets_them_page_by_page(buffer: ReplayBuffer) -> None:
    """track_changes sets the flags of the rows stored a page of tasks at a time (bounded
    memory): every page's tasks, across page edges, as the probe answers."""
    buffer.store_batch(
        [make_row(f"t{t:04d}", "a", s, state={"v": (t * s) % 3}) for t in range(1_100)
         for s in range(3)]
    )  # fmt: skip
    conditions = [Condition.parse(c) for c in ("unchanged(exp_data.state.v)",
                  "changed(exp_data.state.v, next)")]  # fmt: skip
    probed = [sorted(r.id for r in buffer.query(c)) for c in conditions]
    assert buffer.track_changes("exp_data.state.v")
    assert [sorted(r.id for r in buffer.query(c)) for c in conditions] == probed
    assert len(probed[0]) > 700  # tasks 0, 3, 6... keep v; the others change
