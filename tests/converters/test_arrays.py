"""NumpyConverter and TensorConverter: shapes, dtypes, padding and masks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from expstore import DataRow, ReplayBuffer, UniformSampler
from expstore.converters import NumpyConverter, TensorConverter
from tests.helpers import make_row


def _rows() -> list[DataRow]:
    return [
        make_row(
            "t1",
            step=i,
            reward=float(i) if i != 1 else None,
            state={
                "image_features": np.full(4, i, dtype=np.float32),
                "tokens": list(range(i + 1)),
                "url": f"https://x/{i}",
                "t": torch.full((2, 2), i, dtype=torch.float16),
            },
            actions=[{"name": "click", "xy": [i, i + 1]}],
        )
        for i in range(3)
    ]


def test_tensor_converter_stacks_columns_and_tensor_paths() -> None:
    conv = TensorConverter(
        {
            "obs": "exp_data.state.image_features",
            "step": "exp_meta.step",
            "done": "exp_data.done",
            "t": "exp_data.state.t",
            "xy": "exp_data.actions.0.xy",
            "id": "id",
        }
    )
    rows = _rows()
    batch = conv.to_dataset_row(rows)
    assert batch["obs"].shape == (3, 4) and batch["obs"].dtype == torch.float32
    assert batch["step"].tolist() == [0, 1, 2] and batch["step"].dtype == torch.int64
    assert batch["done"].dtype == torch.bool
    assert batch["t"].shape == (3, 2, 2) and batch["t"].dtype == torch.float16
    assert batch["xy"].tolist() == [[0, 1], [1, 2], [2, 3]]
    assert batch["id"] == [r.id for r in rows]  # strings stay a list, as default_collate does
    assert not any(k.endswith("_mask") for k in batch)


def test_variable_length_values_are_padded_with_a_mask() -> None:
    batch = NumpyConverter({"tokens": "exp_data.state.tokens"}, pad_value=-1).to_dataset_row(
        _rows()
    )
    assert batch["tokens"].tolist() == [[0, -1, -1], [0, 1, -1], [0, 1, 2]]
    assert batch["tokens_mask"].tolist() == [
        [True, False, False],
        [True, True, False],
        [True, True, True],
    ]


def test_missing_values_are_padding_and_masked() -> None:
    batch = TensorConverter({"reward": "exp_data.reward_t"}).to_dataset_row(_rows())
    assert batch["reward"].tolist() == [0.0, 0.0, 2.0]
    assert batch["reward_mask"].tolist() == [True, False, True]
    assert batch["reward"].dtype == torch.float64  # Python floats, as default_collate


def test_mask_true_always_adds_masks_and_false_never() -> None:
    always = NumpyConverter({"s": "exp_meta.step"}, mask=True).to_dataset_row(_rows())
    assert always["s_mask"].tolist() == [True, True, True]
    never = NumpyConverter({"r": "exp_data.reward_t"}, mask=False).to_dataset_row(_rows())
    assert set(never) == {"r"}


def test_dtypes_override_numpy_and_torch() -> None:
    conv = TensorConverter(
        {"obs": "exp_data.state.image_features", "step": "exp_meta.step"},
        dtypes={"obs": torch.float64, "step": np.int32},
    )
    batch = conv.to_dataset_row(_rows())
    assert batch["obs"].dtype == torch.float64 and batch["step"].dtype == torch.int32


def test_device_is_honoured() -> None:
    batch = TensorConverter({"s": "step"}, device="cpu").to_dataset_row(_rows())
    assert batch["s"].device == torch.device("cpu")


def test_non_numeric_fields_are_object_arrays_in_numpy() -> None:
    batch = NumpyConverter({"url": "exp_data.state.url"}).to_dataset_row(_rows())
    assert batch["url"].dtype == object and batch["url"].tolist()[0] == "https://x/0"


def test_a_function_of_the_row_is_a_field() -> None:
    batch = NumpyConverter({"n": lambda r: len(r.exp_data.state["tokens"])}).to_dataset_row(_rows())
    assert batch["n"].tolist() == [1, 2, 3]


def test_a_path_no_row_has_is_an_error_unless_lenient() -> None:
    with pytest.raises(ValueError, match=r"no row of the batch has field 'x'.*strict=False"):
        NumpyConverter({"x": "exp_data.state.nope"}).to_dataset_row(_rows())
    lenient = NumpyConverter({"x": "exp_data.state.nope"}, strict=False).to_dataset_row(_rows())
    assert lenient["x"].tolist() == [None, None, None]


@pytest.mark.parametrize(
    ("path", "match"),
    [
        ("", "empty path segment"),
        ("exp_data..x", "empty path segment"),
        ("nothing.x", "unknown field 'nothing.x'; the valid fields"),
        ("exp_meta.step.x", "is a column holding a single number"),
        ("exp_meta.nope", "unknown field 'exp_meta.nope'"),
        ("exp_data", "needs a field"),
    ],
)
def test_bad_paths_are_refused_when_the_converter_is_made(path: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        NumpyConverter({"x": path})


def test_mixed_dimensions_cannot_be_padded() -> None:
    rows = [make_row(state={"v": [1, 2]}), make_row(state={"v": [[1, 2]]})]
    with pytest.raises(ValueError, match="different numbers of dimensions"):
        NumpyConverter({"v": "exp_data.state.v"}).to_dataset_row(rows)


def test_an_empty_batch_gives_empty_arrays() -> None:
    assert NumpyConverter({"s": "step"}).to_dataset_row([])["s"].shape == (0,)


def test_shapes_and_dtypes_survive_storage(buffer: ReplayBuffer) -> None:
    buffer.store_batch(_rows())
    conv = TensorConverter(
        {"obs": "exp_data.state.image_features", "t": "exp_data.state.t", "step": "step"}
    )
    batch = buffer.sample(None, None, conv, 5)
    assert batch["obs"].shape == (5, 4) and batch["obs"].dtype == torch.float32
    assert batch["t"].shape == (5, 2, 2) and batch["t"].dtype == torch.float16
    for i in range(5):
        assert torch.all(batch["obs"][i] == batch["step"][i].float())


# -- torch dtypes numpy lacks (bfloat16, float8) --------------------------------------------

LACKING = [torch.bfloat16, torch.float8_e4m3fn]


def _low_precision_rows(dtype: torch.dtype, lengths: tuple[int, ...] = (3, 3, 3)) -> list[DataRow]:
    # Values every one of these dtypes holds exactly: i + k / 2.
    return [
        make_row("lp", step=i, state={"h": (i + torch.arange(n) / 2).to(dtype)})
        for i, n in enumerate(lengths)
    ]


def _expected(step: int, n: int = 3) -> list[float]:
    return [step + k / 2 for k in range(n)]


@pytest.mark.parametrize("dtype", LACKING)
def test_numpy_converter_upcasts_dtypes_numpy_lacks_to_float32(dtype: torch.dtype) -> None:
    batch = NumpyConverter({"h": "exp_data.state.h"}).to_dataset_row(_low_precision_rows(dtype))
    assert batch["h"].dtype == np.float32
    assert batch["h"].tolist() == [_expected(i) for i in range(3)]


@pytest.mark.parametrize("dtype", LACKING)
def test_tensor_converter_keeps_dtypes_numpy_lacks(dtype: torch.dtype) -> None:
    rows = _low_precision_rows(dtype, lengths=(1, 3, 2))  # ragged: padded, with a mask
    batch = TensorConverter({"h": "exp_data.state.h"}).to_dataset_row(rows)
    assert batch["h"].dtype == dtype and batch["h"].shape == (3, 3)
    assert batch["h"].float().tolist() == [[0.0, 0.0, 0.0], _expected(1), [2.0, 2.5, 0.0]]
    assert batch["h_mask"].dtype == torch.bool and batch["h_mask"].sum() == 6


def test_a_dtype_named_for_a_low_precision_field_wins() -> None:
    rows = _low_precision_rows(torch.bfloat16)
    conv = TensorConverter(
        {"a": "exp_data.state.h", "b": "exp_data.state.h"},
        dtypes={"a": torch.float16, "b": np.float64},
    )
    batch = conv.to_dataset_row(rows)
    assert batch["a"].dtype == torch.float16 and batch["b"].dtype == torch.float64
    assert batch["b"].tolist() == [_expected(i) for i in range(3)]


def test_mixed_tensor_dtypes_keep_numpys_common_dtype() -> None:
    rows = _low_precision_rows(torch.bfloat16)
    rows[1].exp_data.state["h"] = rows[1].exp_data.state["h"].float()
    batch = TensorConverter({"h": "exp_data.state.h"}).to_dataset_row(rows)
    assert batch["h"].dtype == torch.float32


@pytest.mark.parametrize("dtype", LACKING)
def test_low_precision_tensors_from_storage_keep_their_dtype(
    buffer: ReplayBuffer, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    buffer.store_batch(_low_precision_rows(dtype))
    fields = {"h": "exp_data.state.h", "step": "exp_meta.step"}

    def whole_rows(*args: object, **kwargs: object) -> None:
        raise AssertionError("buffer.sample took the whole-row path, not fetch_columns")

    monkeypatch.setattr(buffer.storage, "fetch_keys", whole_rows)
    sampled = buffer.sample(UniformSampler(seed=0), None, TensorConverter(fields), 6)
    as_numpy = buffer.sample(UniformSampler(seed=0), None, NumpyConverter(fields), 6)
    monkeypatch.undo()
    assert sampled["h"].dtype == dtype and sampled["h"].shape == (6, 3)
    assert sampled["h"].float().tolist() == [_expected(s) for s in sampled["step"].tolist()]
    assert as_numpy["h"].dtype == np.float32
    assert as_numpy["h"].tolist() == [_expected(s) for s in as_numpy["step"].tolist()]

    whole = TensorConverter(fields).to_dataset_row(buffer.get_by_task_id("lp"))
    assert whole["h"].dtype == dtype
    assert whole["h"].float().tolist() == [_expected(s) for s in whole["step"].tolist()]
