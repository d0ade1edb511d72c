"""TransitionConverter: DigiRL's batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from expstore import DataRow, ReplayBuffer
from expstore.converters import TransitionConverter
from tests.helpers import make_row

KEYS = [
    "observation",
    "action",
    "image_features",
    "next_image_features",
    "reward",
    "next_observation",
    "done",
    "mc_return",
]


def _transitions() -> list[DataRow]:
    return [
        make_row(
            "t",
            step=i,
            reward=float(i == 2),
            state={"observation": f"screen {i}", "image_features": np.full(6, i, np.float32)},
            next_state={
                "observation": f"screen {i + 1}",
                "image_features": np.full(6, i + 1, np.float32),
            },
            action=f"click({i})",
            done=i == 2,
            ext_info={"mc_return": 0.9 ** (2 - i)},
        )
        for i in range(3)
    ]


def test_numpy_batch_has_digirl_keys_shapes_and_dtypes() -> None:
    batch = TransitionConverter().to_dataset_row(_transitions())
    assert list(batch) == KEYS
    assert batch["observation"].tolist() == ["screen 0", "screen 1", "screen 2"]
    assert batch["action"].tolist() == ["click(0)", "click(1)", "click(2)"]
    assert batch["image_features"].shape == (3, 6) and batch["image_features"].dtype == np.float32
    assert np.array_equal(batch["next_image_features"][:, 0], [1, 2, 3])
    assert batch["reward"].tolist() == [0.0, 0.0, 1.0]
    assert batch["done"].tolist() == [False, False, True] and batch["done"].dtype == bool
    np.testing.assert_allclose(batch["mc_return"], [0.81, 0.9, 1.0])


def test_tensor_batch_through_storage(buffer: ReplayBuffer) -> None:
    buffer.store_batch(_transitions())
    batch = buffer.sample(None, None, TransitionConverter(tensors=True), 4)
    assert batch["image_features"].shape == (4, 6)
    assert batch["image_features"].dtype == torch.float32
    assert isinstance(batch["observation"], list) and len(batch["observation"]) == 4
    assert batch["done"].dtype == torch.bool


def test_fields_can_be_remapped_and_missing_ones_are_none() -> None:
    rows = [make_row(reward=1.0, state={"observation": "o"}) for _ in range(2)]
    for r in rows:
        r.exp_data.v_t = 3.0
    batch = TransitionConverter(fields={"mc_return": "exp_data.v_t"}).to_dataset_row(rows)
    assert batch["mc_return"].tolist() == [3.0, 3.0]
    assert batch["next_observation"].tolist() == [None, None]


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown"):
        TransitionConverter(fields={"obs": "exp_data.state"})
