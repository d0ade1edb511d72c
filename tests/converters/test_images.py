"""ImageConverter: stored images as CHW float tensors exactly as torchvision scales them,
HWC uint8 arrays or PIL images, through the field fetch and through whole rows, on both
backends; bad input named and nothing changed."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
import torch

from expstore import (
    ImageConverter,
    InvalidArgumentError,
    MissingDependencyError,
    PrioritizedSampler,
    ReplayBuffer,
    UniformSampler,
)
from expstore.codec import deep_equal
from tests.helpers import make_row

RNG = np.random.default_rng(7)


def _torchvision_v2(array: np.ndarray) -> torch.Tensor:
    """``v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])`` on an array,
    as torchvision's source does it (transforms/v2/functional: ``to_image`` for a numpy
    array, then ``to_dtype_image`` from an integer to a float dtype)."""
    image = torch.from_numpy(np.atleast_3d(array)).permute((2, 0, 1)).contiguous()
    return image.to(torch.float32).mul_(1.0 / 255)


def _legacy_to_tensor(array: np.ndarray) -> torch.Tensor:
    """torchvision's deprecated ``ToTensor`` on a uint8 array: ``div(255)``."""
    image = torch.from_numpy(np.atleast_3d(array).transpose((2, 0, 1))).contiguous()
    return image.to(torch.float32).div(255)


def _every_value(height: int, width: int, channels: int) -> np.ndarray:
    """An image holding each of the 256 values (and random ones after them)."""
    flat = RNG.integers(0, 256, height * width * channels, dtype=np.uint8)
    flat[:256] = np.arange(256)
    return flat.reshape((height, width, channels) if channels > 1 else (height, width))


def _store(buffer: ReplayBuffer, shots: list[Any]) -> None:
    buffer.store_batch(
        [
            make_row("t", "a", i, reward=float(i), state={"shot": shot, "url": f"u{i}"})
            for i, shot in enumerate(shots)
        ]
    )


def _sample(buffer: ReplayBuffer, converter: ImageConverter, n: int = 4) -> dict[str, Any]:
    return buffer.sample(
        UniformSampler(seed=1, replacement=False), batch_size=n, converter=converter
    )


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_chw_float_is_torchvisions_v2_scaling_bit_for_bit(
    buffer: ReplayBuffer, channels: int
) -> None:
    shots = [_every_value(16, 20, channels) for _ in range(4)]
    _store(buffer, shots)
    conv = ImageConverter("exp_data.state.shot", fields={"step": "exp_meta.step"})
    assert conv.paths == ["exp_data.state.shot", "exp_meta.step"]  # no whole rows fetched
    batch = _sample(buffer, conv)
    images = batch["shot"]
    assert images.dtype == torch.float32 and images.is_contiguous()
    assert images.shape == (4, channels, 16, 20)
    for image, step in zip(images, batch["step"].tolist(), strict=True):
        expected = _torchvision_v2(shots[step])
        assert torch.equal(image, expected)  # exactly, not approximately
        legacy = _legacy_to_tensor(shots[step])
        ulp = torch.finfo(torch.float32).eps
        assert float((image - legacy).abs().max()) <= ulp  # the old ToTensor: one ulp apart
    assert float(images.min()) == 0.0 and float(images.max()) == 1.0


def test_whole_rows_give_the_same_batch_as_the_field_fetch(buffer: ReplayBuffer) -> None:
    shots = [_every_value(16, 16, 3) for _ in range(4)]
    _store(buffer, shots)
    fetched = _sample(buffer, ImageConverter("state.shot", fields={"step": "exp_meta.step"}))
    whole_conv = ImageConverter("state.shot", fields={"step": lambda row: row.exp_meta.step})
    assert whole_conv.paths is None
    whole = _sample(buffer, whole_conv)
    assert torch.equal(fetched["shot"], whole["shot"])
    assert torch.equal(fetched["step"], whole["step"])


def test_hwc_uint8_stacks_numpy_arrays_with_a_channel_axis(buffer: ReplayBuffer) -> None:
    shots = [RNG.integers(0, 256, (12, 18), dtype=np.uint8) for _ in range(3)]
    _store(buffer, shots)
    batch = _sample(
        buffer, ImageConverter(["state.shot"], output="hwc_uint8", fields={"i": "step"}), 3
    )
    assert batch["shot"].shape == (3, 12, 18, 1) and batch["shot"].dtype == np.uint8
    assert batch["shot"].flags.writeable
    for image, step in zip(batch["shot"], batch["i"], strict=True):
        np.testing.assert_array_equal(image[:, :, 0], shots[step])


def test_pil_gives_images_equal_to_the_stored_arrays(buffer: ReplayBuffer) -> None:
    shots = [RNG.integers(0, 256, (10, 14, 4), dtype=np.uint8) for _ in range(3)]
    _store(buffer, shots)
    batch = _sample(
        buffer, ImageConverter({"view": "state.shot"}, output="pil", fields={"i": "step"}), 3
    )
    assert [image.mode for image in batch["view"]] == ["RGBA"] * 3
    for image, step in zip(batch["view"], batch["i"], strict=True):
        np.testing.assert_array_equal(np.asarray(image), shots[step])


def test_images_of_different_sizes_need_stack_false(buffer: ReplayBuffer) -> None:
    shots = [
        RNG.integers(0, 256, (8, 8, 3), dtype=np.uint8),
        RNG.integers(0, 256, (6, 10, 3), dtype=np.uint8),
    ]
    _store(buffer, shots)
    with pytest.raises(InvalidArgumentError, match="different sizes in this batch.*stack=False"):
        _sample(buffer, ImageConverter("state.shot"), 2)
    batch = _sample(buffer, ImageConverter("state.shot", stack=False, fields={"i": "step"}), 2)
    for image, step in zip(batch["shot"], batch["i"].tolist(), strict=True):
        assert torch.equal(image, _torchvision_v2(shots[step]))
    listed = _sample(buffer, ImageConverter("state.shot", output="hwc_uint8", stack=False), 2)
    assert sorted(a.shape for a in listed["shot"]) == [(6, 10, 3), (8, 8, 3)]


def test_prioritized_weights_come_as_tensors_with_chw_float(buffer: ReplayBuffer) -> None:
    _store(buffer, [RNG.integers(0, 256, (8, 8, 3), dtype=np.uint8) for _ in range(3)])
    batch = buffer.sample(
        PrioritizedSampler(seed=0), batch_size=2, converter=ImageConverter("state.shot")
    )
    assert isinstance(batch["weights"], torch.Tensor) and len(batch["ids"]) == 2


@pytest.mark.parametrize(
    ("shot", "says"),
    [
        (np.zeros((3, 8, 8), np.uint8), "exp_data.state.shot is not an image.*channels-first"),
        (np.zeros((8, 8, 3), np.float32), "exp_data.state.shot is not an image.*float32"),
        (None, "has no image at exp_data.state.shot"),
    ],
)
def test_a_row_without_an_image_is_named_and_nothing_changes(
    buffer: ReplayBuffer, shot: Any, says: str
) -> None:
    good = RNG.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    _store(buffer, [good, shot])
    before = {row.id: row for row in buffer.query()}
    bad_id = next(row.id for row in before.values() if row.exp_meta.step == 1)
    with pytest.raises(InvalidArgumentError, match=f"row {bad_id}.*{says}"):
        _sample(buffer, ImageConverter("state.shot", output="hwc_uint8"), 2)
    after = {row.id: row for row in buffer.query()}
    assert after.keys() == before.keys()
    assert all(deep_equal(after[i].exp_data.state, before[i].exp_data.state) for i in after)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"images": "state.shot", "output": "chw"}, "output must be one of"),
        ({"images": "state.shot", "output": "pil", "device": "cpu"}, "device applies to"),
        ({"images": []}, "images must be a field path"),
        ({"images": "exp_meta.step"}, "does not name a value inside a payload field"),
        ({"images": ["state.a.shot", "ext_info.shot"]}, "both be named 'shot'"),
        ({"images": "state.shot", "fields": {"shot": "step"}}, "both name"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidArgumentError, match=says):
        ImageConverter(**kwargs)


def test_pil_without_pillow_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "PIL.Image", None)  # as if Pillow were missing
    with pytest.raises(MissingDependencyError, match=r"pip install 'expstore\[images\]'"):
        ImageConverter("state.shot", output="pil")


def test_hwc_uint8_works_without_torch_and_chw_float_names_the_extra() -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # as if torch were not installed
        import numpy as np
        from expstore import ImageConverter, MissingDependencyError, ReplayBuffer
        from expstore import DataRow, ExpMeta, Experience, UniformSampler
        b = ReplayBuffer()
        b.store(DataRow(exp_meta=ExpMeta(task_id="t", agent_id="a", step=0),
                        exp_data=Experience(state={"shot": np.ones((4, 4, 3), np.uint8)})))
        out = b.sample(UniformSampler(), batch_size=1,
                       converter=ImageConverter("state.shot", output="hwc_uint8"))
        print(out["shot"].shape)
        try:
            ImageConverter("state.shot")
        except MissingDependencyError as exc:
            print(exc)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    assert "(1, 4, 4, 3)" in out
    assert "pip install 'expstore[torch]'" in out


def test_a_converter_pickles_for_dataloader_workers(buffer: ReplayBuffer) -> None:
    shots = [_every_value(16, 16, 3) for _ in range(2)]
    _store(buffer, shots)
    conv = pickle.loads(pickle.dumps(ImageConverter("state.shot", fields={"r": "reward_t"})))
    batch = _sample(buffer, conv, 2)
    assert batch["shot"].shape == (2, 3, 16, 16) and batch["r"].dtype == torch.float64
