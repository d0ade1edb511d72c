"""Rows come back exactly as they went in, on both backends: floats bit for bit (±0.0,
subnormals, 1e308, NaN and infinities in the payload), huge ints, any Unicode text, nested
lists and dicts; through whole-row reads and through the field fetches converters use."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from expstore import NumpyConverter, QueryBuilder, ReplayBuffer, UniformSampler
from tests.helpers import make_row, make_rows

TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=12,
)
SCALARS = (
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True)
    | st.sampled_from([0.0, -0.0, 1e16, -1e16, 1e20, 1e308, -1e308, 5e-324, 9007199254740993.0])
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.booleans()
    | st.none()
    | TEXT
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=20,
)


def same(a: Any, b: Any) -> bool:
    """Equal in type and value; floats by their bits (NaN equals NaN, -0.0 is not 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and repr(a) == repr(b))
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


@pytest.fixture
def buf(db_url: str, buffer_name: str) -> Iterator[ReplayBuffer]:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        yield buffer


def test_the_values_postgres_used_to_change_come_back_exactly(buf: ReplayBuffer) -> None:
    values = [1e20, -0.0, 1e308, 5e-324, -1e16, 1e16, 9999999999999998.0, -0.05, 10**30]
    row = make_row(state={"v": values, "text": "e+ and -0.0 in a string"})
    buf.store(row)
    got = buf.get(row.id)
    assert got is not None and same(got.exp_data.state, row.exp_data.state)
    # Conditions on other fields are not disturbed by the tagged floats.
    assert buf.count(QueryBuilder().eq("exp_data.state.text", "e+ and -0.0 in a string").build())


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(state=VALUES, info=st.dictionaries(TEXT, VALUES, max_size=3))
def test_any_storable_payload_comes_back_exactly(buf: ReplayBuffer, state: Any, info: Any) -> None:
    row = make_row(state=state, ext_info=info)
    buf.store(row)
    got = buf.get(row.id)
    assert got is not None
    assert same(got.exp_data.state, row.exp_data.state)
    assert same(got.exp_data.ext_info, row.exp_data.ext_info)
    # The path a converter reads: the database extracts the part, the codec decodes it.
    only = QueryBuilder().eq("id", row.id).build()
    batch = buf.sample(
        UniformSampler(seed=0), only, NumpyConverter({"s": "exp_data.state"}, strict=False), 1
    )
    fetched = batch["s"][0] if batch["s"].dtype == object else batch["s"].tolist()[0]
    if isinstance(state, (dict, str)) or state is None:
        assert same(fetched, state)


def test_rows_read_in_batches_are_models_like_those_made_by_hand(buf: ReplayBuffer) -> None:
    # Sampling, queries and pages build a batch's models together (trusted_many); each
    # must behave as a model validated by hand: equal, same repr and dump, its own set
    # of fields and its own containers and arrays.
    stored = make_rows(40, tensor=True)
    buf.store_batch(stored)
    by_id = {row.id: row for row in stored}
    for got in (list(buf.query(None)), buf.sample(UniformSampler(seed=1), batch_size=64)):
        for row in got:
            mine = by_id[row.id]
            assert row == mine and repr(row.exp_meta) == repr(mine.exp_meta)
            assert list(row.exp_data.__dict__) == list(mine.exp_data.__dict__)  # field order
            assert row.model_dump().keys() == mine.model_dump().keys()
            assert row.model_fields_set == {"exp_meta", "exp_data", "id"}  # all, as stored
        first = got[0]
        second = next(r for r in got if r.id != first.id)
        first.exp_meta.step = 99  # assignment works on one object only
        first.exp_data.state["obs"][0] = -1.0
        first.exp_data.state["url"] = "changed"
        assert first.exp_meta.step == 99 and second.exp_meta.step != 99
        assert second.exp_data.state["obs"][0] != -1.0 and second.exp_data.state["url"] != "changed"
        assert first.exp_meta.model_fields_set is not second.exp_meta.model_fields_set
