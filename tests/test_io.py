"""Export and import: a round trip gives back equal rows, tensors included, on both backends."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from expstore import CodecError, DataRow, Experience, ExpMeta, ReplayBuffer, StorageError
from expstore.io import (
    COLUMNS,
    count_records,
    detect_format,
    export_rows,
    import_rows,
    record_to_row,
    row_to_record,
)
from expstore.query import QueryBuilder
from tests.helpers import make_rows

FORMATS = ["jsonl", "parquet"]


def awkward_rows() -> list[DataRow]:
    """Rows holding every kind of value the codec stores."""
    rows = make_rows(12, tensor=True)
    rows.append(
        DataRow(
            exp_meta=ExpMeta(task_id="odd", agent_id="a9", step=3, pre_agent="planner"),
            exp_data=Experience(
                state={
                    "image": np.arange(24, dtype=np.uint8).reshape(2, 3, 4),
                    "f16": np.array([1.5, -0.0, np.inf], dtype=np.float16),
                    "big_endian": np.array([1, 2], dtype=">i4"),
                    "scalar": np.float64(2.5),
                    "torch": torch.arange(6, dtype=torch.float32).reshape(2, 3),
                    "bf16": torch.tensor([1.0, 2.5], dtype=torch.bfloat16),
                    "raw": b"\x00\xffbytes",
                    "nan": float("nan"),
                    "__tensor__": "a user key that looks reserved",
                    "unicode": "héllo ✓ \u2028",
                },
                actions=[{"name": "click", "xy": (3, 4)}, "type 'x'"],
                messages=[{"role": "user", "content": "hi"}],
                reward_t=-1.25,
                adv_t=0.5,
                v_t=None,
                done=True,
                next_state=None,
                ext_info={"nested": {"list": [1, [2, {"deep": np.zeros(0, np.int64)}]]}},
            ),
        )
    )
    return rows


@pytest.mark.parametrize("format", FORMATS)
def test_round_trip_gives_back_equal_rows_on_each_backend(
    db_url: str, buffer_name: str, tmp_path: Path, format: str
) -> None:
    rows = awkward_rows()
    path = tmp_path / f"rows.{format}"
    with ReplayBuffer(db_url, name=buffer_name) as source:
        source.store_batch(rows)
        assert export_rows(source, path) == len(rows)
        want = list(source.query())
    with ReplayBuffer(db_url, name=buffer_name + "_copy") as copy:
        assert import_rows(copy, path) == len(rows)
        got = list(copy.query())
    assert got == want
    odd = got[-1].exp_data.state
    assert isinstance(odd["torch"], torch.Tensor) and odd["bf16"].dtype == torch.bfloat16
    assert odd["image"].dtype == np.uint8 and odd["image"].shape == (2, 3, 4)
    assert math.isnan(odd["nan"]) and odd["raw"] == b"\x00\xffbytes"
    assert [r.id for r in got] == [r.id for r in rows]


@pytest.mark.parametrize("format", FORMATS)
def test_export_with_a_condition_writes_only_matching_rows(tmp_path: Path, format: str) -> None:
    buffer = ReplayBuffer()
    buffer.store_batch(make_rows(20))
    cond = QueryBuilder().eq("exp_meta.agent_id", "agent1").and_().gte("exp_meta.step", 2).build()
    path = tmp_path / f"some.{format}"
    assert export_rows(buffer, path, query_condition=cond) == 6
    assert count_records(path) == 6
    copy = ReplayBuffer()
    import_rows(copy, path)
    assert list(copy.query()) == list(buffer.query(cond))


def test_parquet_has_plain_columns_other_tools_can_read(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    buffer = ReplayBuffer(name="web")
    buffer.store_batch(make_rows(5, tensor=True))
    export_rows(
        buffer, tmp_path / "rows.parquet", query_condition={"field": "step", "value": 0, "op": "eq"}
    )
    table = pq.read_table(tmp_path / "rows.parquet")
    # the row's columns, then the derived ones (expstore.model.arrow): arrays and a timestamp
    assert table.column_names[: len(COLUMNS)] == list(COLUMNS)
    assert table.column_names[len(COLUMNS) :] == ["tensor.state.obs", "execute_time_us"]
    assert str(table.schema.field("tensors").type) == "binary"
    about = json.loads(table.schema.metadata[b"expstore"])
    assert about["buffer"] == "web" and about["where"] == "step = 0"
    first = table.to_pylist()[0]
    assert json.loads(first["data"])["state"]["url"] == "https://x/0"
    assert first["tensors"].startswith(b"XST2")


@pytest.mark.parametrize("module", ["pandas", "polars"])
def test_parquet_opens_in_dataframe_libraries(tmp_path: Path, module: str) -> None:
    lib = pytest.importorskip(module)
    buffer = ReplayBuffer()
    buffer.store_batch(make_rows(4, tensor=True))
    export_rows(buffer, tmp_path / "rows.parquet")
    frame = lib.read_parquet(tmp_path / "rows.parquet")
    assert len(frame) == 4 and list(frame.columns)[: len(COLUMNS)] == list(COLUMNS)
    assert list(frame.columns)[len(COLUMNS) :] == ["tensor.state.obs", "execute_time_us"]


def test_jsonl_records_are_self_describing_json(tmp_path: Path) -> None:
    buffer = ReplayBuffer()
    buffer.store_batch(make_rows(3, tensor=True))
    export_rows(buffer, tmp_path / "rows.jsonl")
    lines = (tmp_path / "rows.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    assert list(record) == list(COLUMNS)
    assert record["data"]["state"]["obs"]["__tensor__"]["dtype"] == "<f4"
    assert isinstance(record["tensors"], str)  # base64 of the codec's blob


def test_an_export_that_fails_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import expstore.io as io

    buffer = ReplayBuffer()
    buffer.store_batch(make_rows(5))
    calls = {"n": 0}
    real = io.row_to_record

    def failing(row: DataRow, **kwargs: Any) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] == 3:
            raise CodecError("boom")
        return real(row, **kwargs)

    monkeypatch.setattr(io, "row_to_record", failing)
    for format in FORMATS:
        calls["n"] = 0
        with pytest.raises(CodecError):
            export_rows(buffer, tmp_path / f"x.{format}")
        assert list(tmp_path.iterdir()) == []


def test_progress_is_reported_per_row(tmp_path: Path) -> None:
    buffer = ReplayBuffer()
    buffer.store_batch(make_rows(2500))
    seen: list[int] = []
    export_rows(buffer, tmp_path / "x.parquet", progress=seen.append)
    assert seen == [1000, 1000, 500]
    seen.clear()
    import_rows(ReplayBuffer(), tmp_path / "x.parquet", progress=seen.append)
    assert sum(seen) == 2500


def test_importing_rows_already_there_stops_unless_skipping(tmp_path: Path) -> None:
    buffer = ReplayBuffer()
    buffer.store_batch(make_rows(10))
    export_rows(buffer, tmp_path / "x.jsonl")
    with pytest.raises(StorageError, match=r"already stored.*nothing was stored.*skip_existing"):
        import_rows(buffer, tmp_path / "x.jsonl")
    assert len(buffer) == 10
    buffer.delete(QueryBuilder().eq("exp_meta.task_id", "task0").build())
    assert import_rows(buffer, tmp_path / "x.jsonl", skip_existing=True) == 3
    assert len(buffer) == 10


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.pop("task_id"), "line 1: missing task_id"),
        (lambda r: r.update(colour="red"), "line 1: unknown column 'colour'"),
        (lambda r: r.update(step=-1), "line 1: step: Input should be greater than or equal to 0"),
        (lambda r: r.update(tensors="not base64!"), "line 1: tensors is not valid base64"),
        (lambda r: r.update(tensors=None), "line 1: row .*no blob"),
        (lambda r: r.update(data={"colour": 1}), "line 1: data must be a JSON object"),
    ],
)
def test_a_damaged_record_is_refused_with_its_line(
    tmp_path: Path, change: Any, message: str
) -> None:
    buffer = ReplayBuffer()
    buffer.store_batch(make_rows(1, tensor=True))
    export_rows(buffer, tmp_path / "x.jsonl")
    record = json.loads((tmp_path / "x.jsonl").read_text())
    change(record)
    (tmp_path / "bad.jsonl").write_text(json.dumps(record) + "\n")
    target = ReplayBuffer()
    with pytest.raises(CodecError, match=message):
        import_rows(target, tmp_path / "bad.jsonl")
    assert len(target) == 0


def test_invalid_json_and_invalid_parquet_are_codec_errors(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"id": 1}\n{oops\n')
    with pytest.raises(CodecError, match="bad.jsonl line 1: missing"):
        import_rows(ReplayBuffer(), tmp_path / "bad.jsonl")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(CodecError, match="not a readable Parquet file"):
        import_rows(ReplayBuffer(), tmp_path / "bad.parquet")


def test_format_comes_from_the_suffix_or_is_named() -> None:
    assert detect_format("a/b.JSONL") == "jsonl"
    assert detect_format("b.parquet") == "parquet"
    assert detect_format("-") == "jsonl"
    assert detect_format("b.txt", "parquet") == "parquet"
    with pytest.raises(ValueError, match="cannot tell the format of 'b.txt'"):
        detect_format("b.txt")
    with pytest.raises(ValueError, match="format must be one of jsonl, parquet"):
        detect_format("b.jsonl", "csv")


# -- hypothesis: any storable row survives both formats ---------------------------------------

_arrays = hnp.arrays(
    dtype=st.sampled_from([np.float32, np.float64, np.int8, np.uint16, np.bool_, np.complex64]),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=3),
)
_leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=6)
    | st.binary(max_size=6)
    | _arrays
)
_values = st.recursive(
    _leaves,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=4).filter(lambda k: "\x00" not in k), inner, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=_values, info=st.dictionaries(st.sampled_from(["a", "__float__", "b"]), _values))
def test_any_row_survives_a_record_round_trip(state: Any, info: dict[str, Any]) -> None:
    row = DataRow(
        exp_meta=ExpMeta(task_id="t", agent_id="a", step=1),
        exp_data=Experience(state=state, ext_info=info),
    )
    record = row_to_record(row)
    text = json.dumps(record, allow_nan=False)
    assert record_to_row(json.loads(text)) == row
    binary = row_to_record(row, binary=True)
    binary["data"] = json.dumps(binary["data"], allow_nan=False)
    assert record_to_row(binary) == row


def test_an_import_stopped_by_a_bad_line_says_what_it_stored(tmp_path: Path) -> None:
    from expstore.errors import ExpstoreError

    source = ReplayBuffer()
    source.store_batch(make_rows(1030))
    export_rows(source, tmp_path / "x.jsonl")
    lines = (tmp_path / "x.jsonl").read_text().splitlines()
    lines[1020] = "{not json"
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    target = ReplayBuffer()
    with pytest.raises(ExpstoreError, match=r"line 1021.*the 1000 rows before it were stored"):
        import_rows(target, tmp_path / "bad.jsonl")
    assert len(target) == 1000
    lines[1020] = (tmp_path / "x.jsonl").read_text().splitlines()[1020]  # the line fixed
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    assert import_rows(target, tmp_path / "bad.jsonl", skip_existing=True) == 30
    assert sorted(r.id for r in target.query()) == sorted(r.id for r in source.query())


@pytest.mark.parametrize("depth", [5_000, 300])
def test_an_import_of_json_nested_too_deep_names_the_depth_limit(
    tmp_path: Path, depth: int
) -> None:
    buffer = ReplayBuffer()
    buffer.store_batch(make_rows(1))
    export_rows(buffer, tmp_path / "x.jsonl")
    record = json.loads((tmp_path / "x.jsonl").read_text())
    record["data"]["state"] = {"x": "DEEP"}
    deep = "[" * depth + "]" * depth
    (tmp_path / "deep.jsonl").write_text(json.dumps(record).replace('"DEEP"', deep) + "\n")
    target = ReplayBuffer()
    with pytest.raises(CodecError, match="200 levels deep"):
        import_rows(target, tmp_path / "deep.jsonl")
    assert len(target) == 0
