"""ExpstoreStorage against AWorld's own in-memory storage: the same sequence of block, data,
condition and size calls on both (a Hypothesis state machine), every answer compared; then
what the sequence cannot show (rows for expstore, one transaction per overwrite, errors)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test
from pydantic import BaseModel

from tests.integrations.aworld.helpers import require_aworld

require_aworld()

from aworld.core.storage.condition import ConditionBuilder  # noqa: E402
from aworld.core.storage.data import Data  # noqa: E402
from aworld.core.storage.inmemory_store import InmemoryConditionBuilder, InmemoryStorage  # noqa: E402

from expstore import QueryBuilder, ReplayBuffer  # noqa: E402
from expstore.errors import QueryError, StorageError  # noqa: E402
from expstore.integrations.aworld import ExpstoreStorage  # noqa: E402


class Step(BaseModel):
    """A value as agent code stores them: a pydantic model with a few typed fields."""

    task_id: str
    tag: str = ""
    n: int = 0
    score: float | None = None


BLOCKS = ["b0", "b1", "trajectory_b2"]
IDS = ["d0", "d1", "d2", "d3"]
TAGS = ["", "a", "ab", "a%b", "x_y", "b"]
FIELDS: dict[str, Any] = {
    "task_id": st.sampled_from(["t0", "t1", "t2"]),
    "tag": st.sampled_from(TAGS),
    "n": st.integers(-2, 3),
    "score": st.one_of(st.none(), st.sampled_from([0.0, 0.5, 1.0, -1.5])),
}
steps = st.builds(Step, **FIELDS)


@st.composite
def comparisons(draw: st.DrawFn) -> dict[str, Any]:
    field = draw(st.sampled_from(sorted(FIELDS)))
    value = draw(FIELDS[field])
    ops = ["eq", "ne", "in", "not_in", "is_null", "is_not_null"]
    if value is not None:
        ops += ["gt", "gte", "lt", "lte"]
    if isinstance(value, str):
        ops += ["like", "not_like"]
    op = draw(st.sampled_from(ops))
    if op in ("in", "not_in"):
        value = draw(st.lists(FIELDS[field], max_size=3))
    if op in ("is_null", "is_not_null"):  # (AWorld's filter needs the "value" key)
        value = None
    return {"field": field, "value": value, "op": op}


conditions = st.recursive(
    comparisons(),
    lambda inner: st.one_of(
        st.builds(lambda c: {"and_": c}, st.lists(inner, max_size=3)),
        st.builds(lambda c: {"or_": c}, st.lists(inner, max_size=3)),
    ),
    max_leaves=6,
)


def _view(item: Any) -> Any:
    """What an item holds, all of it (Data's own == compares ids only)."""
    if isinstance(item, Data):
        return (
            item.block_id,
            item.id,
            _view(item.value),
            item.create_at,
            item.update_at,
            item.expires_at,
            item.meta_info,
        )
    if isinstance(item, BaseModel):
        return (type(item), item.model_dump())
    return item


class Differential(RuleBasedStateMachine):
    """Both storages take each call; every answer must match AWorld's. (One expstore
    storage serves every example, emptied first: opening one per example costs more than
    the example.)"""

    ours: ExpstoreStorage

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.theirs = InmemoryStorage()
        self.loop.run_until_complete(self.ours.delete_all())

    def both(self, method: str, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        theirs = self.loop.run_until_complete(getattr(self.theirs, method)(*args, **kwargs))
        ours = self.loop.run_until_complete(getattr(self.ours, method)(*args, **kwargs))
        return ours, theirs

    def teardown(self) -> None:
        self.loop.close()

    @initialize()
    def start(self) -> None:
        pass

    @rule(block=st.sampled_from(BLOCKS), overwrite=st.booleans())
    def create_block(self, block: str, overwrite: bool) -> None:
        ours, theirs = self.both("create_block", block, overwrite=overwrite)
        assert ours == theirs

    @rule(block=st.sampled_from(BLOCKS))
    def delete_block(self, block: str) -> None:
        ours, theirs = self.both("delete_block", block)
        assert ours == theirs

    @rule(block=st.sampled_from([*BLOCKS, "nowhere"]))
    def get_block(self, block: str) -> None:
        ours, theirs = self.both("get_block", block)
        assert ours == theirs

    @rule(
        data_id=st.sampled_from(IDS),
        value=steps,
        block=st.sampled_from(BLOCKS),
        own_block=st.booleans(),
        overwrite=st.booleans(),
    )
    def create_data(
        self, data_id: str, value: Step, block: str, own_block: bool, overwrite: bool
    ) -> None:
        data = Data(id=data_id, value=value, **({"block_id": block} if own_block else {}))
        ours, theirs = self.both("create_data", data, None if own_block else block, overwrite)
        assert ours == theirs

    @rule(
        data_id=st.sampled_from(IDS),
        value=steps,
        block=st.sampled_from(BLOCKS),
        exists=st.booleans(),
    )
    def update_data(self, data_id: str, value: Step, block: str, exists: bool) -> None:
        ours, theirs = self.both("update_data", Data(id=data_id, value=value), block, exists)
        assert ours == theirs

    @rule(data_id=st.sampled_from(IDS), block=st.sampled_from(BLOCKS), exists=st.booleans())
    def delete_data(self, data_id: str, block: str, exists: bool) -> None:
        ours, theirs = self.both("delete_data", data_id, None, block, exists)
        assert ours == theirs

    @rule(value=steps, block=st.sampled_from(BLOCKS))
    def add_data(self, value: Step, block: str) -> None:
        # Data's default id is one id for every Data (AWorld evaluates it once at import):
        # raw values of one block replace each other, in both.
        ours, theirs = self.both("add_data", value, block)
        assert ours == theirs

    @rule(block=st.sampled_from([*BLOCKS, "nowhere"]))
    def get_data_items(self, block: str) -> None:
        ours, theirs = self.both("get_data_items", block)
        assert [_view(i) for i in ours] == [_view(i) for i in theirs]
        assert all(type(i) is Data for i in ours)

    @rule(block=st.sampled_from(BLOCKS))
    def get_data(self, block: str) -> None:
        ours, theirs = self.both("get_data", block)
        assert [_view(i) for i in ours] == [_view(i) for i in theirs]

    @rule(condition=st.one_of(st.none(), conditions))
    def select_and_size(self, condition: Any) -> None:
        try:
            theirs = self.loop.run_until_complete(self.theirs.select_data(condition))
        except TypeError:  # AWorld compared None with a value: no answer to match
            return
        ours = self.loop.run_until_complete(self.ours.select_data(condition))
        # (expstore gives the items in the order they were first stored; AWorld block by
        # block: the same items.)
        assert sorted(map(repr, map(_view, ours))) == sorted(map(repr, map(_view, theirs)))
        ours_size = self.loop.run_until_complete(self.ours.size(condition))
        assert ours_size == len(theirs)

    @rule()
    def delete_all(self) -> None:
        ours, theirs = self.both("delete_all")
        assert ours == theirs


def test_every_call_answers_as_aworlds_in_memory_storage(db_url: str, buffer_name: str) -> None:
    storage = ExpstoreStorage(db_url, name=buffer_name)
    machine = type("OnBackend", (Differential,), {"ours": storage})
    try:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=int(os.environ.get("EXPSTORE_AWORLD_EXAMPLES", "25")),
                stateful_step_count=30,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    finally:
        asyncio.run(storage.aclose())


# -- conditions ---------------------------------------------------------------------------
def _run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture
def filled(db_url: str, buffer_name: str) -> Any:
    async def fill() -> tuple[ExpstoreStorage, InmemoryStorage]:
        ours, theirs = ExpstoreStorage(db_url, name=buffer_name), InmemoryStorage()
        for storage in (ours, theirs):
            for i in range(12):
                value = Step(
                    task_id=f"t{i % 3}",
                    tag="ab"[i % 2] * (i % 4),
                    n=i,
                    score=None if i % 5 == 0 else i / 2,
                )
                await storage.create_data(Data(id=f"d{i}", value=value), f"b{i % 2}")
        return ours, theirs

    return _run(fill())


def test_a_condition_builders_chain_selects_what_aworlds_does(filled: Any) -> None:
    ours, theirs = filled

    def chain(builder: ConditionBuilder) -> ConditionBuilder:
        inner = InmemoryConditionBuilder(None).eq("task_id", "t1").or_().gte("n", 9)
        return builder.like("tag", "a").or_().lt("n", 2).and_().nested(inner)

    async def check() -> None:
        expected = await theirs.select_data(chain(InmemoryConditionBuilder(None)).build())
        assert expected  # (the chain folds left to right: (a or b) and (c or d))
        for given in (
            chain(InmemoryConditionBuilder(None)),
            chain(InmemoryConditionBuilder(None)).build(),
        ):
            got = await ours.select_data(given)
            assert sorted(d.id for d in got) == sorted(d.id for d in expected)

    _run(check())


def test_an_expstore_condition_is_taken_as_it_is(filled: Any) -> None:
    ours, _ = filled
    condition = QueryBuilder().eq("exp_meta.task_id", "b0").and_().gt("exp_data.state.n", 6).build()
    assert sorted(d.id for d in _run(ours.select_data(condition))) == ["d10", "d8"]


def test_a_condition_of_an_unknown_operator_says_which_are_known(filled: Any) -> None:
    ours, _ = filled
    with pytest.raises(QueryError, match="unknown AWorld operator 'near'.*expected eq, ne"):
        _run(ours.select_data({"field": "n", "value": 1, "op": "near"}))


def test_like_matches_the_text_literally_anywhere_as_aworlds_substring_test(
    db_url: str, buffer_name: str
) -> None:
    async def check() -> list[str]:
        ours = ExpstoreStorage(db_url, name=buffer_name)
        for i, tag in enumerate(["50%", "50 percent", "a_b", "axb", "A%"]):
            await ours.create_data(Data(id=f"d{i}", value=Step(task_id="t", tag=tag)), "b")
        hits = await ours.select_data(
            {
                "or_": [
                    {"field": "tag", "value": "0%", "op": "like"},
                    {"field": "tag", "value": "_", "op": "like"},
                ]
            }
        )
        return sorted(d.value.tag for d in hits)

    assert _run(check()) == ["50%", "a_b"]


# -- rows ---------------------------------------------------------------------------------
def test_items_are_rows_expstore_reads_with_the_value_in_state(
    db_url: str, buffer_name: str
) -> None:
    async def store() -> None:
        storage = ExpstoreStorage(db_url, name=buffer_name)
        await storage.create_data(Data(id="d1", value=Step(task_id="t1", score=0.5)), "b1")
        await storage.create_data(Step(task_id="bare"), "b1")  # a model without Data
        await storage.aclose()

    _run(store())
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        rows = list(buffer.query())
        assert [r.exp_meta.task_id for r in rows] == ["b1", "b1"]
        assert rows[0].exp_data.state == {"task_id": "t1", "tag": "", "n": 0, "score": 0.5}
        assert rows[0].exp_data.ext_info["aworld"]["value"].endswith(":Step")
        assert buffer.count(QueryBuilder().eq("exp_data.state.task_id", "bare").build()) == 1


def test_an_item_comes_back_of_its_own_class_in_a_new_handle(db_url: str, buffer_name: str) -> None:
    item = Data(id="d1", value=Step(task_id="t1", n=3), meta_info={"k": [1, 2]}, expires_at=5.0)

    async def round_trip() -> tuple[list[Any], list[Any]]:
        first = ExpstoreStorage(db_url, name=buffer_name)
        await first.create_data(item, "b1")
        await first.create_data(Step(task_id="bare", score=1.5), "b1")
        await first.add_data([1, "two", {"three": 3.0}], "b2")
        await first.aclose()
        again = ExpstoreStorage(db_url, name=buffer_name)
        return await again.get_data_items("b1"), await again.get_data("b2")

    items, values = _run(round_trip())
    assert _view(items[0]) == _view(item) and type(items[0]) is Data
    assert items[1] == Step(task_id="bare", score=1.5)
    assert values == [[1, "two", {"three": 3.0}]]


def test_an_overwrite_deletes_and_inserts_in_one_transaction(
    db_url: str, buffer_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from expstore.storage import writer

    async def overwrite_failing() -> list[Any]:
        storage = ExpstoreStorage(db_url, name=buffer_name)
        await storage.create_data(Data(id="d1", value=Step(task_id="old")), "b1")

        def broken(*args: Any, **kwargs: Any) -> Any:
            raise StorageError("the insert failed")

        monkeypatch.setattr(writer, "write_in", broken)
        with pytest.raises(StorageError, match="the insert failed"):
            await storage.create_data(Data(id="d1", value=Step(task_id="new")), "b1")
        monkeypatch.undo()
        return await storage.get_data_items("b1")

    (kept,) = _run(overwrite_failing())
    assert kept.value.task_id == "old"  # the delete was rolled back with the insert


def test_a_dict_value_is_found_by_its_keys(db_url: str, buffer_name: str) -> None:
    """(AWorld's getattr finds no field in a dict; expstore reads its keys.)"""

    async def check() -> list[Any]:
        storage = ExpstoreStorage(db_url, name=buffer_name)
        await storage.add_data({"task_id": "t1", "n": 2}, "b1")
        return await storage.select_data({"field": "n", "value": 2, "op": "eq"})

    (found,) = _run(check())
    assert found.value == {"task_id": "t1", "n": 2}


def test_an_indexed_field_is_an_index_range(db_url: str, buffer_name: str) -> None:
    storage = ExpstoreStorage(db_url, name=buffer_name)
    storage.buffer.sync.create_index("exp_data.state.task_id")
    _run(storage.create_data(Data(id="d1", value=Step(task_id="t1")), "b1"))
    assert _run(storage.size({"field": "task_id", "value": "t1", "op": "eq"})) == 1
