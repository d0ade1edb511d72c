"""changed(field) / unchanged(field): a step compared with the previous step of its
trajectory, in every spelling (builder, dict, --where), compiled to SQL on both backends,
and usable wherever a condition is (queries, samplers, claims)."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy.dialects import postgresql, sqlite

from expstore import ReplayBuffer
from expstore.db.schema import rows
from expstore.errors import QueryError
from expstore.query import Changed, Condition, QueryBuilder, to_sql
from expstore.samplers import UniformSampler
from tests.helpers import make_row

RNG = np.random.default_rng(3)
PAGES = [RNG.integers(0, 255, (160, 160, 3), dtype=np.uint8) for _ in range(3)]
#: The page each step of a trajectory shows.
SEQUENCE = [0, 0, 1, 1, 1, 2, 0]
CHANGED = [0, 2, 5, 6]  # the steps whose page differs from the step before (and the first)


def fill(buffer: ReplayBuffer, tasks: tuple[str, ...] = ("A", "B")) -> None:
    buffer.store_batch(
        [
            make_row(
                task,
                "a",
                step,
                reward=float(step),
                state={"screen": PAGES[p], "url": f"u{p}", "small": np.full(3, p, np.int32)},
            )
            for task in tasks
            for step, p in enumerate(SEQUENCE)
        ]
    )


def steps(buffer: ReplayBuffer, condition: Condition | None, task: str = "A") -> list[int]:
    return sorted(r.exp_meta.step for r in buffer.query(condition) if r.exp_meta.task_id == task)


def test_changed_and_unchanged_compare_with_the_previous_step(buffer: ReplayBuffer) -> None:
    fill(buffer)
    changed = QueryBuilder().changed("exp_data.state.screen").build()
    unchanged = QueryBuilder().unchanged("exp_data.state.screen").build()
    for task in ("A", "B"):
        assert steps(buffer, changed, task) == CHANGED
        assert steps(buffer, unchanged, task) == [1, 3, 4]
    assert buffer.count(unchanged) == 6


def test_next_compares_with_the_next_step(buffer: ReplayBuffer) -> None:
    """Whether the step's action changed the page (WebGym's filter_same_screenshot)."""
    fill(buffer)
    next_changed = QueryBuilder().changed("exp_data.state.screen", "next").build()
    assert steps(buffer, next_changed) == [1, 4, 5, 6]  # the last step has no next: kept
    assert steps(buffer, Condition.parse("unchanged(exp_data.state.screen, next)")) == [0, 2, 3]


def test_json_values_and_columns_compare_too(buffer: ReplayBuffer) -> None:
    fill(buffer)
    assert steps(buffer, Condition.parse("changed(exp_data.state.url)")) == CHANGED
    assert steps(buffer, Condition.parse("unchanged(agent_id)")) == [1, 2, 3, 4, 5, 6]


def test_arrays_in_the_rows_blob_are_never_unchanged(buffer: ReplayBuffer) -> None:
    """Their bytes are not visible to SQL: every step counts as changed, none is dropped."""
    fill(buffer)
    assert steps(buffer, Condition.parse("unchanged(exp_data.state.small)")) == []
    assert steps(buffer, Condition.parse("changed(exp_data.state.small)")) == list(range(7))


def test_the_previous_step_is_the_largest_step_below_whatever_the_write_order(
    buffer: ReplayBuffer,
) -> None:
    shown = {0: 0, 1: 0, 5: 1, 9: 1}
    rows_ = [make_row("T", "a", s, state={"screen": PAGES[p]}) for s, p in shown.items()]
    buffer.store_batch(rows_[::-1])  # newest first
    assert steps(buffer, Condition.parse("unchanged(exp_data.state.screen)"), "T") == [1, 9]


def test_a_trajectory_never_compares_with_another(buffer: ReplayBuffer) -> None:
    buffer.store_batch([make_row("A", "a", 0, state={"screen": PAGES[0]})])
    buffer.store_batch([make_row("B", "a", 1, state={"screen": PAGES[0]})])
    assert buffer.count(Condition.parse("unchanged(exp_data.state.screen)")) == 0


def test_samplers_and_claims_take_it_like_any_condition(buffer: ReplayBuffer) -> None:
    fill(buffer)
    changed = Condition.parse("changed(exp_data.state.screen) and task_id = 'A'")
    drawn = buffer.sample(UniformSampler(), changed, batch_size=50)
    assert {r.exp_meta.step for r in drawn} == set(CHANGED)
    claim = buffer.claim(10, changed, consumer="learner")
    assert sorted(r.exp_meta.step for r in claim.batch) == CHANGED
    claim.ack()


def test_every_spelling_gives_the_same_condition() -> None:
    built = QueryBuilder().unchanged("exp_data.state.screen").and_().eq("task_id", "t").build()
    text = "unchanged(exp_data.state.screen) AND task_id = 't'"
    assert str(built) == text
    assert Condition.parse(text) == built
    assert Condition.from_dict(built.to_dict()) == built
    assert built.to_dict()["and_"][0] == {"field": "exp_data.state.screen", "op": "unchanged"}
    assert Condition.parse("CHANGED(exp_data.state.screen)") == Changed("exp_data.state.screen")
    forward = Changed("exp_data.state.screen", towards="next")
    assert str(forward) == "changed(exp_data.state.screen, next)"
    assert Condition.parse(str(forward)) == forward
    assert Condition.from_dict(forward.to_dict()) == forward


def test_it_compiles_to_a_correlated_probe_of_the_previous_step() -> None:
    condition = Changed("exp_data.state.screen")
    for dialect in (sqlite.dialect(), postgresql.dialect()):
        sql = str(to_sql(condition, rows, dialect.name).compile(dialect=dialect))
        assert "expstore_previous.task_id = expstore_rows.task_id" in sql
        assert "expstore_previous.step < expstore_rows.step" in sql
        assert "ORDER BY expstore_previous.step DESC" in sql


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("changed(exp_data.state.screen", r"expected '\)' after the field of changed"),
        ("changed()", "expected a field name"),
        ("changed(nosuch)", "nosuch"),
        ("not changed(exp_data.state.screen)", "unchanged"),
        ("changed(exp_data.state.screen, later)", "expected previous or next"),
    ],
)
def test_bad_spellings_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(QueryError, match=message):
        Condition.parse(text)


def test_bad_dicts_and_one_row_evaluation_are_refused() -> None:
    with pytest.raises(QueryError, match="optionally value 'previous' or 'next'"):
        Condition.from_dict({"field": "exp_data.state.s", "op": "changed", "value": 1})
    with pytest.raises(QueryError, match="one row does not hold"):
        Changed("exp_data.state.s").matches(make_row())
    with pytest.raises(QueryError, match=r"changed\('nosuch'\) \(call 1\)"):
        QueryBuilder().changed("nosuch")


@pytest.mark.parametrize("towards", ["previous", "next"])
def test_sql_agrees_with_a_python_reference_on_random_trajectories(
    buffer: ReplayBuffer, towards: str
) -> None:
    rng = np.random.default_rng(11)
    stored = []
    for t in range(6):
        steps_ = sorted(rng.choice(40, size=int(rng.integers(1, 9)), replace=False).tolist())
        for step in steps_:
            page = int(rng.integers(0, 3))
            stored.append((f"T{t}", step, page))
    buffer.store_batch(
        [make_row(t, "a", s, state={"screen": PAGES[p], "url": f"u{p}"}) for t, s, p in stored]
    )
    expected: set[tuple[str, int]] = set()
    for task in {t for t, _, _ in stored}:
        mine = sorted((s, p) for t, s, p in stored if t == task)
        for i, (step, page) in enumerate(mine):
            j = i - 1 if towards == "previous" else i + 1
            if 0 <= j < len(mine) and mine[j][1] == page:
                expected.add((task, step))
    for field in ("exp_data.state.screen", "exp_data.state.url"):
        same = QueryBuilder().unchanged(field, towards).build()
        differ = QueryBuilder().changed(field, towards).build()
        got = {(r.exp_meta.task_id, r.exp_meta.step) for r in buffer.query(same)}
        assert got == expected
        assert buffer.count(differ) == len(stored) - len(expected)
