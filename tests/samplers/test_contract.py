"""The contract every built-in sampler keeps, on SQLite and on Postgres."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from expstore import EmptyBufferError, ExpstoreError, ReplayBuffer
from expstore.query import QueryBuilder, QueryCondition
from expstore.samplers import (
    LatestSampler,
    PrioritizedSampler,
    RandomTaskSampler,
    RecencySampler,
    RewardWeightedSampler,
    Sampler,
    SliceSampler,
    StalenessAwareSampler,
    StratifiedSampler,
    UniformSampler,
)
from tests.helpers import make_rows

SAMPLERS: dict[str, Callable[[int | None], Sampler]] = {
    "uniform": lambda seed: UniformSampler(seed=seed),
    "uniform_epochs": lambda seed: UniformSampler(replacement=False, seed=seed),
    "recency": lambda seed: RecencySampler(power=1.5, seed=seed),
    "prioritized": lambda seed: PrioritizedSampler(seed=seed),
    "reward_weighted": lambda seed: RewardWeightedSampler(temperature=20.0, seed=seed),
    "slice": lambda seed: SliceSampler(2, seed=seed),
    "stratified": lambda seed: StratifiedSampler(by="exp_meta.agent_id", seed=seed),
    "latest": lambda seed: LatestSampler(seed=seed),
    "staleness": lambda seed: StalenessAwareSampler(seed=seed, max_staleness=3),
    "random_task": lambda seed: RandomTaskSampler(seed=seed),
}
WITH_REPLACEMENT = {"uniform", "prioritized", "reward_weighted", "slice", "stratified", "staleness"}
RANDOM = set(SAMPLERS) - {"latest"}


@pytest.fixture(params=sorted(SAMPLERS))
def sampler_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _ids(sampler: Sampler, buffer: ReplayBuffer, n: int, cond: QueryCondition = None) -> list[str]:
    return [r.id for r in sampler.sample(buffer.storage, n, cond)]


def test_same_seed_over_same_data_gives_same_batches(
    buffer: ReplayBuffer, sampler_name: str
) -> None:
    buffer.store_batch(make_rows(40))
    a, b = SAMPLERS[sampler_name](7), SAMPLERS[sampler_name](7)
    for _ in range(3):  # successive batches too
        assert _ids(a, buffer, 6) == _ids(b, buffer, 6)


@pytest.mark.parametrize("name", sorted(RANDOM))
def test_different_seeds_give_different_batches(buffer: ReplayBuffer, name: str) -> None:
    buffer.store_batch(make_rows(40))
    batches = {tuple(_ids(SAMPLERS[name](seed), buffer, 4)) for seed in range(5)}
    assert len(batches) > 1


def test_no_matching_row_raises_empty_buffer_error_naming_the_condition(
    buffer: ReplayBuffer, sampler_name: str
) -> None:
    sampler = SAMPLERS[sampler_name](0)
    with pytest.raises(EmptyBufferError, match=r"no rows match in buffer .* \(condition: none"):
        buffer.sample(sampler, batch_size=4)
    buffer.store_batch(make_rows(8))
    cond = QueryBuilder().eq("exp_meta.task_id", "no-such-task").build()
    with pytest.raises(EmptyBufferError) as caught:
        buffer.sample(sampler, cond, batch_size=4)
    assert str(cond) in str(caught.value)
    assert buffer.storage.name in str(caught.value)  # type: ignore[attr-defined]
    assert isinstance(caught.value, ExpstoreError) and isinstance(caught.value, ValueError)


def test_batch_larger_than_matches_fills_with_replacement_or_returns_what_exists(
    buffer: ReplayBuffer, sampler_name: str
) -> None:
    buffer.store_batch(make_rows(16, tasks=2))  # 8 rows per task
    cond = QueryBuilder().eq("exp_meta.task_id", "task1").build()
    rows = SAMPLERS[sampler_name](0).sample(buffer.storage, 20, cond)
    assert {r.exp_meta.task_id for r in rows} == {"task1"}
    if sampler_name in WITH_REPLACEMENT:
        assert len(rows) == 20
    else:
        assert sorted(r.id for r in rows) == sorted(r.id for r in buffer.query(cond))


def test_rows_come_from_the_condition_only(buffer: ReplayBuffer, sampler_name: str) -> None:
    buffer.store_batch(make_rows(40, tasks=4, agents=2))
    cond = QueryBuilder().eq("exp_meta.agent_id", "agent1").build()
    rows = SAMPLERS[sampler_name](3).sample(buffer.storage, 6, cond)
    assert rows
    if sampler_name == "random_task":  # whole tasks: every row of a task with a match
        assert {r.exp_meta.task_id for r in rows} <= {"task1", "task3"}
    else:
        assert {r.exp_meta.agent_id for r in rows} == {"agent1"}


@pytest.mark.parametrize("bad", [0, -1, 2.5, "8", True, None])
def test_batch_size_must_be_a_positive_int(
    buffer: ReplayBuffer, sampler_name: str, bad: object
) -> None:
    buffer.store_batch(make_rows(4))
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        SAMPLERS[sampler_name](0).sample(buffer.storage, bad)  # type: ignore[arg-type]


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every statement sent: through SQLAlchemy's execution, and the ones compiled once and
    run on the driver's cursor (expstore.db.compiled)."""
    from expstore.db.compiled import CompiledSelect

    seen: list[str] = []

    def spy(conn, cursor, statement, params, context, executemany) -> None:  # noqa: ANN001
        seen.append(" ".join(statement.split()))

    run = CompiledSelect.run

    def spy_run(self: CompiledSelect, conn, **params):  # noqa: ANN001, ANN202
        seen.append(" ".join(self.sql.split()))
        return run(self, conn, **params)

    monkeypatch.setattr(CompiledSelect, "run", spy_run)
    event.listen(Engine, "before_cursor_execute", spy)
    yield seen
    event.remove(Engine, "before_cursor_execute", spy)


@pytest.mark.parametrize("flat", [True, False], ids=["key space", "key index"])
def test_with_a_warm_index_sampling_only_checks_freshness_and_reads_by_key(
    buffer: ReplayBuffer, sampler_name: str, statements: list[str], flat: bool
) -> None:
    buffer.store_batch(make_rows(60))
    cond = QueryBuilder().eq("exp_meta.agent_id", "agent0").build()
    sampler = SAMPLERS[sampler_name](0)
    sampler.flat = flat
    sampler.sample(buffer.storage, 4, cond)  # warms the key index
    statements.clear()
    misses = buffer.cache_stats().misses
    sampler.sample(buffer.storage, 4, cond)
    # Rows the row cache holds are not read again: no fetch when it held them all.
    fetches = 1 if buffer.cache_stats().misses > misses else 0
    queries = [s for s in statements if s.upper().startswith("SELECT")]
    assert not any("random" in s.lower() for s in queries)
    assert "expstore_buffers.version" in queries[0]  # the freshness check
    # Then the chosen rows are fetched by key; a draw over the key space first probes
    # candidate keys, by key too, after reading the envelope's bound by its index (tasks:
    # their row counts and rows, by the task index; windows: their rows by task and step;
    # priorities: their bounds, and the least matching one, by the priority index;
    # strata: the values, by a loose scan, and which a matching row holds: those found
    # before by key, the others among the rows written since by their index).
    by_index = [
        q
        for q in queries[1:]
        if re.search(
            r"max\(expstore_rows\.reward_t\)|expstore_rows\.task_id IN"
            r"|expstore_rows\.task_id = \S+ AND expstore_rows\.step >="
            r"|FROM expstore_priorities WHERE expstore_priorities\.buffer_id"
            r"|WITH RECURSIVE expstore_distinct"
            r"|AND expstore_rows\.\"?key\"? >= \S+ (AND .+ )?ORDER BY",
            q,
        )
        # a draw over the key space that gives up checks freshness again for the key index
        or (flat and "expstore_buffers.version" in q)
    ]
    assert all(
        re.search(r'expstore_rows\."?key"? (IN|= any)', q) for q in queries[1:] if q not in by_index
    )
    can = getattr(sampler, "can_draw_flat", lambda _: sampler_name == "random_task")(cond)
    probes = 3 if flat and can else 0
    assert len(by_index) <= (probes if flat and can else 0)
    assert 1 + fetches <= len(queries) <= 1 + fetches + probes + len(by_index)


def test_sampling_after_a_delete_never_returns_deleted_rows(
    buffer: ReplayBuffer, sampler_name: str
) -> None:
    buffer.store_batch(make_rows(24, tasks=3, agents=1))  # one agent: slices need its steps
    sampler = SAMPLERS[sampler_name](1)
    sampler.sample(buffer.storage, 4)
    buffer.delete(QueryBuilder().eq("exp_meta.task_id", "task0").build())
    for _ in range(3):
        rows = sampler.sample(buffer.storage, 8)
        assert rows and "task0" not in {r.exp_meta.task_id for r in rows}


def test_samplers_pickle_without_their_derived_arrays(buffer: ReplayBuffer) -> None:
    import pickle

    buffer.store_batch(make_rows(10))
    sampler = PrioritizedSampler(seed=0)
    sampler.flat = False  # the key-index path, which derives arrays
    sampler.sample(buffer.storage, 4)
    copy = pickle.loads(pickle.dumps(sampler))
    assert not copy.__dict__["_derived"]._entries
    assert np.array_equal(
        sampler.rng.integers(0, 100, 5), copy.rng.integers(0, 100, 5)
    )  # the stream travels with it


@pytest.mark.parametrize("fast_path", [False, True], ids=["rows", "fields"])
def test_rows_deleted_between_choosing_and_fetching_are_replaced(
    buffer: ReplayBuffer, sampler_name: str, fast_path: bool
) -> None:
    """Another writer evicts rows after the sampler chose them: the sampler chooses again,
    so a sampler with replacement still fills its batch, and no deleted row comes back."""
    from expstore import NumpyConverter

    buffer.store_batch(make_rows(40, tasks=4))
    storage = buffer.storage
    deleted: list[str] = []
    real_keys, real_columns = storage.fetch_keys, storage.fetch_columns

    def delete_some_first(keys: np.ndarray) -> None:
        if not deleted:  # once: delete half of the chosen rows, as an evicting writer would
            doomed = [r.id for r in real_keys(np.unique(keys)[::2])]
            deleted.extend(doomed)
            buffer.delete(QueryBuilder().in_("id", doomed).build())

    def fetch_keys(keys: np.ndarray) -> list:
        delete_some_first(keys)
        return real_keys(keys)

    def fetch_columns(keys: np.ndarray, paths: list[str], **kwargs: object) -> tuple:
        delete_some_first(keys)
        return real_columns(keys, paths, **kwargs)

    reader = storage._reader  # type: ignore[attr-defined]
    real_raw = reader.read_raw

    def read_raw(keys: list[int]) -> tuple:  # whole rows through the row cache are read raw
        delete_some_first(np.array(keys))
        return real_raw(keys)

    storage.fetch_keys = fetch_keys  # type: ignore[method-assign]
    storage.fetch_columns = fetch_columns  # type: ignore[method-assign]
    reader.read_raw = read_raw
    sampler = SAMPLERS[sampler_name](3)
    if fast_path:
        batch = buffer.sample(sampler, None, NumpyConverter({"i": "exp_data.state.i"}), 12)
        got = sampler.last_ids
        assert len(batch["i"]) == len(got)
    else:
        got = [r.id for r in sampler.sample(storage, 12)]
    assert deleted and not set(got) & set(deleted)
    if sampler_name in WITH_REPLACEMENT:
        assert len(got) == 12
    elif sampler_name == "random_task":  # every remaining row of the chosen tasks
        tasks = {r.exp_meta.task_id for r in buffer.query() if r.id in set(got)}
        assert sorted(got) == sorted(r.id for r in buffer.query() if r.exp_meta.task_id in tasks)
    else:
        assert 0 < len(got) <= 12
