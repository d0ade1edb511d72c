"""Image arrays as Hugging Face Image columns in to_arrow and the Parquet export: datasets
shows them as PIL images equal to the stored arrays, the rest of the table is what it was,
the file imports back unchanged, and bad input leaves nothing (expstore.model.arrow)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from expstore import (
    InvalidArgumentError,
    MissingDependencyError,
    ReplayBuffer,
    export_rows,
    import_rows,
)
from expstore.codec import deep_equal
from expstore.query import QueryBuilder
from tests.helpers import make_row

pa = pytest.importorskip("pyarrow")
datasets = pytest.importorskip("datasets")

RNG = np.random.default_rng(4)

#: One image per row at state.screenshot, of every layout and two sizes, and a row without.
SHOTS = [
    RNG.integers(0, 256, (36, 64, 3), dtype=np.uint8),
    RNG.integers(0, 256, (36, 64, 4), dtype=np.uint8),
    RNG.integers(0, 256, (20, 24), dtype=np.uint8),
    RNG.integers(0, 256, (20, 24, 1), dtype=np.uint8),
    None,
]


def _store(buffer: ReplayBuffer) -> list[str]:
    rows = [
        make_row(
            "t",
            "a",
            i,
            reward=float(i),
            state={
                "screenshot": shot,
                "obs": np.full(3, i, np.float32),
                "url": f"https://x/{i}",
            },
        )
        for i, shot in enumerate(SHOTS)
    ]
    buffer.store_batch(rows)
    return [row.id for row in rows]


def _same_pixels(image: object, array: np.ndarray) -> bool:
    pixels = np.asarray(image)
    return bool(
        pixels.shape == array.shape[: pixels.ndim]
        and np.array_equal(pixels, array.reshape(pixels.shape))
    )


def test_to_arrow_makes_image_columns_instead_of_tensor_columns(buffer: ReplayBuffer) -> None:
    _store(buffer)
    plain = buffer.to_arrow()
    assert "tensor.state.screenshot" in plain.column_names  # without images=: as before
    assert b"huggingface" not in plain.schema.metadata
    table = buffer.to_arrow(images="auto")
    assert "tensor.state.screenshot" not in table.column_names
    assert "tensor.state.obs" in table.column_names  # other arrays keep their columns
    field = table.schema.field("image.state.screenshot")
    assert field.type == datasets.Image().pa_type
    cells = table.column("image.state.screenshot").to_pylist()
    assert cells[-1] is None and all(c["path"] is None for c in cells[:-1])
    assert all(c["bytes"].startswith(b"\x89PNG") for c in cells[:-1])
    # Everything but the replaced column is the table as it was.
    for name in plain.column_names:
        if name != "tensor.state.screenshot":
            assert table.column(name).equals(plain.column(name)), name


def test_the_schema_metadata_is_the_features_datasets_would_infer_with_images() -> None:
    with ReplayBuffer() as buffer:
        _store(buffer)
        schema = buffer.to_arrow(images="auto").schema
    metadata = json.loads(schema.metadata[b"huggingface"])
    assert set(metadata) == {"info"} and set(metadata["info"]) == {"features"}
    expected = datasets.Features.from_arrow_schema(schema.remove_metadata())
    expected["image.state.screenshot"] = datasets.Image()
    # datasets before 2.17 take the features from the metadata whole; later ones column by
    # column: both get the same features.
    assert datasets.Features.from_dict(metadata["info"]["features"]) == expected
    assert datasets.Features.from_arrow_schema(schema) == expected
    assert list(metadata["info"]["features"]) == schema.names


def test_datasets_decodes_the_images_equal_to_the_stored_arrays(
    buffer: ReplayBuffer, tmp_path: Path
) -> None:
    _store(buffer)
    path = tmp_path / "screens.parquet"
    assert export_rows(buffer, path, images="auto") == len(SHOTS)
    for ds in (
        datasets.Dataset.from_parquet(str(path), cache_dir=str(tmp_path / "hf")),
        datasets.load_dataset(
            "parquet", data_files=str(path), split="train", cache_dir=str(tmp_path / "hf2")
        ),
    ):
        assert ds.features["image.state.screenshot"] == datasets.Image()
        images = ds["image.state.screenshot"]
        modes = [None if image is None else image.mode for image in images]
        assert modes == ["RGB", "RGBA", "L", "L", None]
        for image, shot in zip(images, SHOTS, strict=True):
            if shot is not None:
                assert image.size == (shot.shape[1], shot.shape[0])
                assert _same_pixels(image, shot)
        assert ds[2]["tensor.state.obs"] == [2.0, 2.0, 2.0]


def test_the_export_with_images_imports_back_unchanged(
    buffer: ReplayBuffer, tmp_path: Path
) -> None:
    _store(buffer)
    path = tmp_path / "screens.parquet"
    export_rows(buffer, path, images=["exp_data.state.screenshot"])
    with ReplayBuffer() as copy:
        assert import_rows(copy, path) == len(SHOTS)
        got = {row.id: row for row in copy.query()}
        for row in buffer.query():
            assert deep_equal(got[row.id].exp_data.state, row.exp_data.state)
            shot = got[row.id].exp_data.state["screenshot"]
            if shot is not None:
                assert shot.dtype == np.uint8 and shot.flags.c_contiguous


def test_auto_leaves_null_where_a_later_row_holds_no_image(buffer: ReplayBuffer) -> None:
    buffer.store_batch(
        [
            make_row(step=0, state={"view": RNG.integers(0, 256, (32, 32, 3), dtype=np.uint8)}),
            make_row(step=1, state={"view": np.zeros((32, 32, 3), np.float32)}),
            make_row(step=2, state={"view": "not yet"}),
        ]
    )
    cells = buffer.to_arrow(images="auto").column("image.state.view").to_pylist()
    assert cells[0] is not None and cells[1:] == [None, None]


def test_a_named_path_holding_no_image_stops_the_export_and_leaves_nothing(
    buffer: ReplayBuffer, tmp_path: Path
) -> None:
    ids = _store(buffer)
    bad = make_row("t", "a", 9, state={"screenshot": np.zeros((3, 36, 64), np.uint8)})
    buffer.store(bad)
    before = {row.id: row for row in buffer.query()}
    out = tmp_path / "out"  # (the SQLite database is in tmp_path)
    out.mkdir()
    path = out / "screens.parquet"
    with pytest.raises(InvalidArgumentError) as caught:
        export_rows(buffer, path, images=["state.screenshot"])
    message = str(caught.value)
    assert f"row {bad.id}: exp_data.state.screenshot is not an image" in message
    assert "channels-first" in message
    assert list(out.iterdir()) == []  # no file, no .partial
    after = {row.id: row for row in buffer.query()}
    assert after.keys() == before.keys() == {*ids, bad.id}
    assert all(deep_equal(after[i].exp_data.state, before[i].exp_data.state) for i in after)
    # The other rows still export.
    good = QueryBuilder().lt("exp_meta.step", 9).build()
    assert export_rows(buffer, path, query_condition=good, images=["state.screenshot"]) == 5


def test_images_are_for_parquet_only(tmp_path: Path) -> None:
    with ReplayBuffer() as buffer:
        _store(buffer)
        with pytest.raises(InvalidArgumentError, match="only Parquet holds"):
            export_rows(buffer, tmp_path / "rows.jsonl", images="auto")
    assert list(tmp_path.iterdir()) == []


def test_image_columns_without_pillow_name_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ReplayBuffer() as buffer:
        _store(buffer)
        monkeypatch.setitem(sys.modules, "PIL.Image", None)  # as if Pillow were missing
        with pytest.raises(MissingDependencyError, match=r"pip install 'expstore\[images\]'"):
            export_rows(buffer, tmp_path / "rows.parquet", images="auto")
        with pytest.raises(MissingDependencyError, match="images="):
            buffer.to_arrow(images="auto")
        assert buffer.to_arrow().num_rows == len(SHOTS)  # without images: no Pillow needed
    assert list(tmp_path.iterdir()) == []


def test_an_empty_selection_has_the_image_columns_named() -> None:
    with ReplayBuffer() as buffer:
        table = buffer.to_arrow(images=["state.screenshot"])
    assert table.num_rows == 0
    assert table.schema.field("image.state.screenshot").type == datasets.Image().pa_type


def test_pandas_gets_png_bytes(buffer: ReplayBuffer) -> None:
    _store(buffer)
    frame = buffer.to_pandas(images="auto")
    first = frame["image.state.screenshot"][0]
    assert set(first) == {"bytes", "path"} and first["bytes"].startswith(b"\x89PNG")


def test_the_metadata_matches_datasets_for_every_dtype_of_array_column() -> None:
    arrays = {
        "b": np.zeros((2, 3), bool),
        "u8": np.zeros(4, np.uint8),
        "i16": np.zeros((2, 2, 2), np.int16),
        "u64": np.zeros(2, np.uint64),
        "f16": np.zeros(3, np.float16),
        "f32": np.zeros(1, np.float32),
        "one": np.array(1.5),
    }
    with ReplayBuffer() as buffer:
        buffer.store(make_row(state={"shot": SHOTS[0], **arrays}))
        schema = buffer.to_arrow(images="auto").schema
    assert {f"tensor.state.{k}" for k in arrays} <= set(schema.names)
    metadata = json.loads(schema.metadata[b"huggingface"])
    expected = datasets.Features.from_arrow_schema(schema.remove_metadata())
    expected["image.state.shot"] = datasets.Image()
    assert datasets.Features.from_dict(metadata["info"]["features"]) == expected
    assert datasets.Features.from_arrow_schema(schema) == expected


def test_a_key_with_a_dot_is_found_and_read(buffer: ReplayBuffer) -> None:
    buffer.store(make_row(state={"page.main": SHOTS[0]}))
    cells = buffer.to_arrow(images="auto").column("image.state.page.main").to_pylist()
    assert cells[0] is not None and cells[0]["bytes"].startswith(b"\x89PNG")


def test_large_rows_make_smaller_row_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    import expstore.io

    monkeypatch.setattr(expstore.io, "CHUNK_BYTES", 3 * SHOTS[0].nbytes)
    with ReplayBuffer() as buffer:
        buffer.store_batch([make_row(step=i, state={"shot": SHOTS[0]}) for i in range(7)])
        path = tmp_path / "big.parquet"
        assert export_rows(buffer, path, images="auto") == 7
        assert buffer.to_arrow(images="auto").num_rows == 7
    parquet = pq.ParquetFile(path)
    assert [parquet.metadata.row_group(i).num_rows for i in range(3)] == [3, 3, 1]
    with ReplayBuffer() as copy:
        assert import_rows(copy, path) == 7
