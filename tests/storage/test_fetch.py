"""fetch_columns (the database extracts only the parts a path reaches) gives exactly what
reading the same paths from whole decoded rows gives, on SQLite and Postgres, whatever the
payload holds: escaped dicts, non-finite floats, arrays, nulls, missing keys, list indexes,
keys that look like the codec's reserved keys or need quoting."""

from __future__ import annotations

import math
import uuid
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer
from expstore.codec import deep_equal
from expstore.model.paths import MISSING, read_path

KEYS = [
    "a", "b", "0", "1", "01", "-1", "+1", "__tensor__", "__float__", "__escaped__",
    'q"k', "b\\s", "x y", " x", "é", "a,b", "{", "x}", "NULL", "[0]", "$",
]  # fmt: skip

arrays = st.builds(
    lambda n, dtype: np.arange(n, dtype=dtype),
    st.integers(0, 3),
    st.sampled_from([np.float32, np.int64, np.uint8]),
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=3)
)
floats = st.sampled_from([0.5, -0.0, math.inf, -math.inf, math.nan])
values = st.recursive(
    scalars | floats | arrays,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)
    ),
    max_leaves=8,
)


def _paths_into(value: Any, prefix: str, out: list[str], depth: int = 0) -> None:
    """Every path that reaches something in ``value``, plus some that reach nothing."""
    out.append(prefix)
    out.append(prefix + ".nope")
    if depth > 3:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if "." not in key:
                _paths_into(item, f"{prefix}.{key}", out, depth + 1)
    elif isinstance(value, (list, np.ndarray)):
        for i in range(min(len(value), 2)):
            item = value[i]
            _paths_into(item, f"{prefix}.{i}", out, depth + 1)
        # Steps that only look like indexes: dict keys, never list subscripts.
        out.extend(f"{prefix}.{step}" for step in ("7", "01", "-1", "+1"))


def _fetch_fields(
    buf: ReplayBuffer, keys: Any, paths: list[str], *, writable: bool = True
) -> list[tuple[Any, ...]]:
    """Per row found: (id, value at paths[0], value at paths[1], ...)."""
    ids, columns = buf.storage.fetch_columns(keys, paths, writable=writable)
    return list(zip(ids, *map(list, columns), strict=True))


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    states=st.lists(
        st.dictionaries(st.sampled_from(KEYS), values, max_size=4), min_size=1, max_size=3
    ),
    ext=st.dictionaries(st.sampled_from(KEYS), values, max_size=3),
    actions=st.lists(values, max_size=2),
)
def test_fetch_fields_equals_reading_whole_rows(
    db_url: str, states: list[dict[str, Any]], ext: dict[str, Any], actions: list[Any]
) -> None:
    rows = [
        DataRow(
            exp_meta=ExpMeta(task_id="t", agent_id="a", step=i),
            exp_data=Experience(state=state, actions=actions, ext_info=ext, reward_t=1.0),
        )
        for i, state in enumerate(states)
    ]
    paths: list[str] = ["id", "exp_meta.step", "exp_data.reward_t", "exp_data.next_state"]
    for row in rows:
        _paths_into(row.exp_data.state, "exp_data.state", paths)
    _paths_into(ext, "exp_data.ext_info", paths)
    _paths_into(actions, "exp_data.actions", paths)
    paths = list(dict.fromkeys(paths))
    with ReplayBuffer(db_url, name=f"ff_{uuid.uuid4().hex[:12]}") as buf:
        buf.store_batch(rows)
        keys = buf.storage.key_index()["key"]
        keys = np.concatenate([keys, keys[:1]])  # a repeated key
        whole = buf.storage.fetch_keys(keys)
        got = _fetch_fields(buf, keys, paths)
        # One path alone takes a shorter way through the plan, and read-only arrays another.
        alone = {p: _fetch_fields(buf, keys, [p], writable=False) for p in paths[::3][:12]}
        buf.clear()
    assert len(got) == len(whole) == len(keys)
    for row, values_ in zip(whole, got, strict=True):
        assert values_[0] == row.id
        for path, value in zip(paths, values_[1:], strict=True):
            expected = read_path(row, path)
            if expected is MISSING:
                assert value is MISSING, path
            else:
                assert deep_equal(value, expected), (path, value, expected)
    for path, records in alone.items():
        assert len(records) == len(whole)
        for row, (row_id, value) in zip(whole, records, strict=True):
            expected = read_path(row, path)
            assert row_id == row.id
            assert value is MISSING if expected is MISSING else deep_equal(value, expected), path


def test_deep_parts_of_many_rows_share_one_checked_spec(db_url: str, buffer_name: str) -> None:
    rows = [
        DataRow(
            exp_meta=ExpMeta(task_id="t", agent_id="a", step=i),
            exp_data=Experience(state={"obs": np.full(3, i, np.float32), "url": f"u{i}"}),
        )
        for i in range(20)
    ]
    with ReplayBuffer(db_url, name=buffer_name) as buf:
        buf.store_batch(rows)
        keys = buf.storage.key_index()["key"]
        decoder = buf.storage.fetcher.decoder
        assert decoder.specs == {}
        got = _fetch_fields(buf, keys, ["exp_data.state.obs"])
    assert [g[1].tolist() for g in got] == [[i] * 3 for i in range(20)]
    assert len(decoder.specs) == 1
    assert all(g[1].flags.writeable for g in got)


def test_a_damaged_blob_read_by_fields_names_the_row(tmp_path) -> None:
    from sqlalchemy import update

    from expstore import CodecError
    from expstore.db.schema import rows as table
    from expstore.storage import create_sql_engine

    row = DataRow(
        exp_meta=ExpMeta(task_id="t", agent_id="a", step=0),
        exp_data=Experience(state={"obs": np.ones(4, np.float32)}),
    )
    with ReplayBuffer(f"sqlite:///{tmp_path / 'x.db'}") as buf:
        buf.store(row)
        keys = buf.storage.key_index()["key"]
        engine = create_sql_engine(buf.storage.url)
        with engine.begin() as conn:
            conn.execute(update(table).values(tensors=b"XST1\x00\x00\x00\x00" + bytes(16)))
        engine.dispose()
        with pytest.raises(CodecError, match=row.id):
            buf.storage.fetch_columns(keys, ["exp_data.state.obs"])


def test_a_tensor_field_comes_back_stacked_in_the_order_asked(
    db_url: str, buffer_name: str
) -> None:
    rows = [
        DataRow(
            exp_meta=ExpMeta(task_id="t", agent_id="a", step=i),
            exp_data=Experience(state={"obs": np.full((2, 3), i, np.float32), "n": i}),
        )
        for i in range(20)
    ]
    with ReplayBuffer(db_url, name=buffer_name) as buf:
        buf.store_batch(rows)
        keys = buf.storage.key_index()["key"]
        chosen = keys[[5, 0, 5, 19]]
        ids, (obs, n) = buf.storage.fetch_columns(
            chosen, ["exp_data.state.obs", "exp_data.state.n"]
        )
    assert ids == [rows[i].id for i in (5, 0, 5, 19)]
    assert n == [5, 0, 5, 19]
    assert isinstance(obs, np.ndarray) and obs.shape == (4, 2, 3) and obs.dtype == np.float32
    assert obs.flags.writeable and obs.flags.c_contiguous
    assert np.array_equal(obs, np.stack([np.full((2, 3), i, np.float32) for i in (5, 0, 5, 19)]))


def test_one_damaged_blob_in_a_batch_names_its_row(tmp_path) -> None:
    from sqlalchemy import select, update

    from expstore import CodecError, TensorConverter
    from expstore.db.schema import rows as table
    from expstore.storage import create_sql_engine

    rows = [
        DataRow(
            exp_meta=ExpMeta(task_id="t", agent_id="a", step=i),
            exp_data=Experience(state={"obs": np.full(4, i, np.float32)}),
        )
        for i in range(10)
    ]
    with ReplayBuffer(f"sqlite:///{tmp_path / 'x.db'}") as buf:
        buf.store_batch(rows)
        keys = buf.storage.key_index()["key"]
        assert isinstance(buf.storage.fetch_columns(keys, ["exp_data.state.obs"])[1][0], np.ndarray)
        engine = create_sql_engine(buf.storage.url)
        with engine.begin() as conn:
            blob = conn.execute(select(table.c.tensors).where(table.c.id == rows[6].id)).scalar()
            damaged = blob[:-1] + bytes([blob[-1] ^ 1])  # one bit of the data, header intact
            conn.execute(update(table).where(table.c.id == rows[6].id).values(tensors=damaged))
        engine.dispose()
        with pytest.raises(CodecError, match=f"{rows[6].id}.*checksum"):
            buf.storage.fetch_columns(keys, ["exp_data.state.obs"])
        converter = TensorConverter({"obs": "exp_data.state.obs"})
        with pytest.raises(CodecError, match=rows[6].id):
            buf.sample(converter=converter, batch_size=500)
        # The other rows still read.
        ids, (obs,) = buf.storage.fetch_columns(keys[:6], ["exp_data.state.obs"])
        assert obs.tolist() == [[i] * 4 for i in range(6)]
