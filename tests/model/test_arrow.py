"""Rows as Arrow, pandas, polars and Parquet: array columns readers use directly, timestamps
without loss, and the export's round trip unchanged (expstore.model.arrow)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from expstore import ReplayBuffer, export_rows, import_rows
from expstore.query import QueryBuilder
from tests.helpers import make_row

pa = pytest.importorskip("pyarrow")
pd = pytest.importorskip("pandas")


def _buffer() -> ReplayBuffer:
    buffer = ReplayBuffer()
    rows = [
        make_row(
            "t",
            "a",
            i,
            reward=float(i),
            execute_time=1_790_000_000.123456 + i,
            state={
                "obs": np.full((2, 3), i, np.float32) + np.float32(0.5),
                "mask": torch.tensor([1.0, -2.5, 3.25, i], dtype=torch.bfloat16),
                "nested": {"ids": np.arange(3, dtype=np.int64) + i},
                "url": f"u{i}",
            },
        )
        for i in range(4)
    ]
    rows.append(make_row("t", "a", 9, state={"obs": np.zeros(5, np.float32)}))  # other shape
    buffer.store_batch(rows)
    return buffer


def test_to_arrow_adds_array_columns_with_their_shape_and_dtype() -> None:
    table = _buffer().to_arrow()
    obs = table.schema.field("tensor.state.obs")
    assert obs.type == pa.list_(pa.list_(pa.float32(), 3), 2)
    assert obs.metadata[b"shape"] == b"[2, 3]" and obs.metadata[b"stored_as"] == b"<f4"
    mask = table.schema.field("tensor.state.mask")
    assert mask.type == pa.list_(pa.float32(), 4) and mask.metadata[b"stored_as"] == b"bfloat16"
    assert "tensor.state.nested.ids" in table.column_names
    assert table.column("tensor.state.obs").null_count == 1  # the row of another shape


def test_to_pandas_gives_arrays_equal_to_what_was_stored() -> None:
    buffer = _buffer()
    df = buffer.to_pandas(QueryBuilder().lt("exp_meta.step", 9).build())
    rows = list(buffer.query(QueryBuilder().lt("exp_meta.step", 9).build()))
    assert len(df) == 4
    for cell, row in zip(df["tensor.state.obs"], rows, strict=True):
        np.testing.assert_array_equal(np.stack(cell), row.exp_data.state["obs"])
    for cell, row in zip(df["tensor.state.mask"], rows, strict=True):
        exact = row.exp_data.state["mask"].float().numpy()  # bfloat16 -> float32 is exact
        np.testing.assert_array_equal(cell, exact)
    for cell, row in zip(df["tensor.state.nested.ids"], rows, strict=True):
        assert cell.tolist() == row.exp_data.state["nested"]["ids"].tolist()


def test_execute_time_us_keeps_the_time_to_the_microsecond() -> None:
    buffer = _buffer()
    table = buffer.to_arrow()
    stamps = table.column("execute_time_us").to_pylist()
    times = table.column("execute_time").to_pylist()
    assert stamps == [round(t * 1e6) for t in times]
    assert table.schema.field("execute_time_us").type == pa.int64()


def test_hugging_face_datasets_give_tensors_and_the_exact_time(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    path = tmp_path / "rows.parquet"
    export_rows(_buffer(), path)
    ds = datasets.Dataset.from_parquet(str(path)).with_format("torch")
    row = ds[1]
    assert isinstance(row["tensor.state.obs"], torch.Tensor)
    assert torch.equal(row["tensor.state.obs"], torch.full((2, 3), 1.5))
    assert row["execute_time_us"].item() == round((1_790_000_000.123456 + 1) * 1e6)


def test_polars_reads_array_columns_as_arrays() -> None:
    pl = pytest.importorskip("polars")
    frame = pl.from_arrow(_buffer().to_arrow())
    assert frame["tensor.state.obs"].dtype == pl.Array(pl.Float32, (2, 3))


def test_parquet_export_has_the_columns_and_imports_unchanged(tmp_path: Path) -> None:
    buffer = _buffer()
    path = tmp_path / "rows.parquet"
    assert export_rows(buffer, path) == 5
    df = pd.read_parquet(path)
    np.testing.assert_array_equal(
        np.stack(df["tensor.state.obs"][0]), np.full((2, 3), 0.5, np.float32)
    )
    with ReplayBuffer() as copy:
        assert import_rows(copy, path) == 5
        got = {r.id: r for r in copy.query()}
        for row in buffer.query():
            mask = got[row.id].exp_data.state.get("mask")
            if mask is not None:
                assert mask.dtype == torch.bfloat16 and torch.equal(
                    mask, row.exp_data.state["mask"]
                )


def test_an_empty_selection_is_an_empty_table() -> None:
    table = _buffer().to_arrow(QueryBuilder().eq("exp_meta.agent_id", "nobody").build())
    assert table.num_rows == 0 and "execute_time_us" in table.column_names
