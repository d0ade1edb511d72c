"""extend()'s column path: a batch encoded column by column must give exactly the tuples
the row path gives (documents, blobs, digests, every column), take the row path for what
it cannot express, and store rows that read back, and dedup, as store_batch's."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from expstore import DataRow, Experience, ExpMeta, InvalidArgumentError, ReplayBuffer
from expstore.model.columnar import fresh_ids, parse_columns
from expstore.storage.column_rows import encoded_columns
from expstore.storage.writer import encode_chunk


def _both_ways(columns: dict[str, Any], chunk: int = 3) -> bool:
    """Whether the column path took the batch; if it did, its tuples equal the row path's
    (which encodes the same batch one row at a time), chunk by chunk."""
    parsed = parse_columns(columns)
    encoded = encoded_columns(parsed)
    if encoded is None:
        return False
    expected = encode_chunk(parsed.rows(), 7)  # type: ignore[arg-type]
    got = [t for s in range(0, parsed.n, chunk) for t in encoded.encode(s, s + chunk, 7)]
    assert len(got) == len(expected)
    for mine, theirs in zip(got, expected, strict=True):
        assert mine == theirs
    return True


def _base(n: int) -> dict[str, Any]:
    return {"task_id": [f"env{i}" for i in range(n)], "agent_id": "policy", "step": 3}


def _vector_env(n: int = 7) -> dict[str, Any]:
    rng = np.random.default_rng(n)
    return {
        **_base(n),
        "state": {
            "obs": rng.random((n, 4, 3), dtype=np.float32),
            "pixels": rng.integers(0, 255, (n, 2, 2), dtype=np.uint8),
            "mask": torch.ones(n, 5, dtype=torch.bfloat16),
            "legal": torch.rand(n, 2) < 0.5,
            "t": np.arange(n),
            "x": rng.random(n),
            "on": np.arange(n) % 2 == 0,
            "name": np.array([f"é{i}" for i in range(n)]),
            "note": [None if i % 2 else f"n{i}" for i in range(n)],
            "const": "same",
            "nested": {"__tensor__": rng.random((n, 2)), "k": 1.5},
            "empty": {},
        },
        "actions": rng.integers(0, 4, n),
        "next_state": {"obs": rng.random((n, 4, 3), dtype=np.float32)},
        "reward_t": rng.random(n),
        "adv_t": np.zeros(n, np.float32),
        "done": rng.random(n) < 0.3,
        "policy_version": np.full(n, 2),
        "task_name": "web",
        "pre_agent": [f"p{i}" for i in range(n)],
        "execute_time": np.linspace(1.7e9, 1.7e9 + 1, n),
    }


def test_a_vectorised_env_batch_takes_the_column_path_and_matches_the_row_path() -> None:
    for n in (1, 2, 7, 10):
        assert _both_ways(_vector_env(n))


@pytest.mark.parametrize(
    "extra",
    [
        {"action": np.arange(5)},  # AWorld's singular action: a list of one per row
        {"id": [f"given-{i}" for i in range(5)]},
        {"state": torch.zeros(5, 3, dtype=torch.float16)},
        {"state": np.zeros((5, 0), np.float32)},  # empty tensors still make a blob
        {"state": [1, True, None, "x", 2.5]},
        {"state": {"a": {"b": {"c": np.ones((5, 2), np.int16)}}}, "reward_t": 1.0},
        {"actions": torch.arange(5)},
        {"state": np.ones((5, 2), np.complex64)},
    ],
)
def test_other_column_shapes_take_the_column_path(extra: dict[str, Any]) -> None:
    assert _both_ways({**_base(5), **extra})


@pytest.mark.parametrize(
    "extra",
    [
        {"state": np.array([1.0, np.nan, 2.0, 3.0, 4.0])},  # a float stored tagged
        {"state": np.array([0.0, -0.0, 1.0, 2.0, 3.0])},
        {"state": [1e20, 1.0, 2.0, 3.0, 4.0]},
        {"state": {"x": float("inf")}},
        {"messages": [[{"role": "user", "content": "hi"}]] * 5},
        {"ext_info": [{"k": i} for i in range(5)]},
        {"actions": [[{"move": i}] for i in range(5)]},
        {"state": np.zeros((5, 2), ">f4")},  # big-endian: converted by the row encoder
        {"state": np.array([{"a": 1}] * 5, dtype=object)},
        {"step": [1.0, 2.0, 3.0, 4.0, 5.0]},  # floats for an int column: the model's call
        {"reward_t": [1, 2, 3, 4, 5]},  # ints for a float column: coerced by the model
        {"state": np.float32(1.5)},  # a numpy scalar: stored as a tensor per row
    ],
)
def test_what_the_template_cannot_express_takes_the_row_path(extra: dict[str, Any]) -> None:
    columns = {**_base(5), **extra}
    assert not _both_ways(columns)
    assert len(parse_columns(columns).rows()) == 5  # and the row path takes it


def test_bad_values_still_get_the_row_paths_errors(db_url: str, buffer_name: str) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buf:
        buf.extend(_vector_env(3))
        for bad, words in (
            ({"state": ["ok", "bad\x00", "ok"]}, "NUL"),
            ({"step": [1, -1, 2]}, "step"),
            ({"task_id": ["a", "", "c"]}, "task_id"),
            ({"reward_t": [0.0, float("nan"), 1.0]}, "reward_t"),
        ):
            with pytest.raises(InvalidArgumentError, match=words):
                buf.extend({**_base(3), **bad})
        assert len(buf) == 3


_DTYPES = st.sampled_from(["<f4", "<f8", "<i8", "|u1", "|b1", "<f2", "<i2", "<u4"])


@st.composite
def _payload_columns(draw: st.DrawFn, n: int) -> Any:
    kind = draw(st.sampled_from(["tensor", "vector", "list", "plain", "dict"]))
    if kind == "tensor":
        shape = (n, *draw(st.lists(st.integers(0, 3), min_size=1, max_size=2)))
        return draw(hnp.arrays(np.dtype(draw(_DTYPES)), shape))
    if kind == "vector":
        return draw(hnp.arrays(np.dtype(draw(_DTYPES)), (n,)))
    if kind == "list":
        scalar = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=4)
        return draw(st.lists(scalar | st.floats(), min_size=n, max_size=n))
    if kind == "plain":
        return draw(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4))
    keys = st.text(max_size=3) | st.sampled_from(["__tensor__", "__float__", "__escaped__"])
    return draw(st.dictionaries(keys, _payload_columns(n), max_size=3))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), n=st.integers(1, 6))
def test_any_batch_the_column_path_takes_matches_the_row_path(data: st.DataObject, n: int) -> None:
    columns: dict[str, Any] = {**_base(n), "state": data.draw(_payload_columns(n))}
    if data.draw(st.booleans()):
        columns["next_state"] = data.draw(_payload_columns(n))
    try:
        _both_ways(columns, chunk=data.draw(st.integers(1, 4)))
    except InvalidArgumentError:
        pass  # a value the row path refuses (e.g. a lone surrogate): refused either way


def test_fresh_ids_are_distinct_version_4_uuids() -> None:
    ids = fresh_ids(10_000)
    assert len(set(ids)) == len(ids)
    for text in ids[:200]:
        parsed = uuid.UUID(text)
        assert parsed.version == 4 and str(parsed) == text


def test_column_rows_read_back_and_dedup_as_store_batch_rows(db_url: str, buffer_name: str) -> None:
    n = 6
    columns = _vector_env(n)
    state = columns["state"]
    assert encoded_columns(parse_columns(columns)) is not None
    with ReplayBuffer(db_url, name=buffer_name) as buf:
        assert buf.extend(columns) == n
        got = list(buf.query())
        assert len(got) == n
        for i, row in enumerate(got):
            assert row.exp_meta.task_id == f"env{i}" and row.exp_meta.pre_agent == f"p{i}"
            assert row.exp_meta.execute_time == columns["execute_time"][i]
            assert row.exp_data.actions == int(columns["actions"][i])
            s = row.exp_data.state
            np.testing.assert_array_equal(s["obs"], state["obs"][i])
            assert s["obs"].dtype == np.float32 and s["pixels"].dtype == np.uint8
            assert torch.equal(s["mask"], state["mask"][i]) and s["mask"].dtype == torch.bfloat16
            assert s["name"] == f"é{i}" and s["const"] == "same" and s["empty"] == {}
            np.testing.assert_array_equal(
                s["nested"]["__tensor__"], state["nested"]["__tensor__"][i]
            )
            assert row.exp_data.reward_t == columns["reward_t"][i]
        # The same content as DataRows (fresh ids, built from the columns: a document read
        # back from JSONB has its keys in another order): store_batch's digests match.
        parsed = parse_columns(columns)
        encoded = encoded_columns(parsed)
        assert encoded is not None
        rows = []
        for i in range(n):
            cut = encoded.row(i)
            meta = {**cut.exp_meta.__dict__, "execute_time": 1.0}
            rows.append(
                DataRow(exp_meta=ExpMeta(**meta), exp_data=Experience(**cut.exp_data.__dict__))
            )
        assert buf.store_batch(rows, dedup="skip") == 0
        assert buf.extend({**columns, "execute_time": 5.0}, dedup="skip") == 0
        assert len(buf) == n


def test_values_the_row_path_refuses_or_converts_are_left_to_it(
    db_url: str, buffer_name: str
) -> None:
    """Keys a stored dict cannot hold, array subclasses and tensors the codec refuses take
    the row path, with its errors (found by review)."""
    for bad in ({"a\x00b": np.arange(3)}, {"\ud800": np.arange(3)}):
        assert encoded_columns(parse_columns({**_base(3), "state": bad})) is None
    masked = np.ma.array([1.0, 2.0, 3.0], mask=[False, True, False])
    assert encoded_columns(parse_columns({**_base(3), "state": masked})) is None
    sparse = torch.eye(3).to_sparse()
    assert encoded_columns(parse_columns({**_base(3), "state": sparse})) is None
    with ReplayBuffer(db_url, name=buffer_name) as buf:
        with pytest.raises(InvalidArgumentError):
            buf.extend({**_base(3), "state": {"a\x00b": np.arange(3)}})
        with pytest.raises(InvalidArgumentError):
            buf.extend({**_base(3), "state": sparse})
        assert buf.extend({**_base(3), "state": masked}) == 3  # as the row path stores it
        assert len(buf) == 3


def test_a_layout_is_checked_against_the_row_path_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A trainer's extend of the same columns every step: rows 0 and N-1 are encoded both
    ways the first time a layout comes, not at every call; another layout (a column of
    another type, another constant in the document) is checked again."""
    import expstore.storage.column_rows as column_rows

    checked: list[int] = []
    real = column_rows.encode_chunk

    def counting(chunk: Any, buffer_id: int, *args: Any, **kwargs: Any) -> Any:
        checked.append(len(chunk))
        return real(chunk, buffer_id, *args, **kwargs)

    monkeypatch.setattr(column_rows, "encode_chunk", counting)
    monkeypatch.setattr(column_rows, "_AGREED", set())
    rng = np.random.default_rng(0)

    def step(k: int, **extra: Any) -> dict[str, Any]:
        return {**_base(8), "step": k, "state": {"obs": rng.random((8, 4))}, **extra}

    assert _both_ways(step(1))
    first = len(checked)
    assert first == 2  # rows 0 and 7, once each
    for k in range(2, 6):
        assert _both_ways(step(k))  # (compares every row itself)
    assert len(checked) == first
    assert _both_ways(step(6, reward_t=np.ones(8)))  # another column: checked
    assert len(checked) == first + 2
    assert _both_ways(step(7, next_state={"lr": 0.1}))  # another document: checked
    assert len(checked) == first + 4
