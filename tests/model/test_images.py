"""Which arrays are images, their PNG bytes and PIL images, and how they are named
(expstore.model.images)."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from expstore import InvalidArgumentError, MissingDependencyError, UnsupportedTypeError
from expstore.codec import array_digest
from expstore.model.images import (
    AUTO_MIN_SIDE,
    ImageSelection,
    as_image,
    describe_image,
    from_png,
    image_problem,
    looks_like_image,
    png_bytes,
    to_pil,
)
from tests.helpers import make_row

RNG = np.random.default_rng(34)


def _pixels(*shape: int) -> np.ndarray:
    return RNG.integers(0, 256, shape, dtype=np.uint8)


@pytest.mark.parametrize(
    ("shape", "mode"),
    [((20, 30), "L"), ((20, 30, 1), "L"), ((20, 30, 3), "RGB"), ((20, 30, 4), "RGBA")],
)
def test_every_image_layout_goes_to_png_and_back_bit_for_bit(
    shape: tuple[int, ...], mode: str
) -> None:
    array = _pixels(*shape)
    data = png_bytes(array)
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    with Image.open(io.BytesIO(data)) as image:
        assert image.format == "PNG" and image.mode == mode and image.size == (30, 20)
    back = from_png(data)
    np.testing.assert_array_equal(back, array.reshape(back.shape))
    assert back.shape == (shape if shape[-1] != 1 else shape[:2])
    pil = to_pil(array)
    assert pil.mode == mode and np.array_equal(np.asarray(pil), back)


def test_a_uint8_torch_tensor_is_an_image_too() -> None:
    array = _pixels(24, 32, 3)
    tensor = torch.from_numpy(array.copy())
    assert image_problem(tensor) is None and looks_like_image(tensor)
    np.testing.assert_array_equal(from_png(png_bytes(tensor)), array)
    assert describe_image(tensor) == describe_image(array)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (np.zeros((20, 30, 3), np.float32), "float32 array [20, 30, 3]; an image is uint8"),
        (np.zeros((3, 20, 30), np.uint8), "it looks channels-first, CxHxW"),
        (np.zeros((20, 30, 2), np.uint8), "an image is HxW, HxWx1, HxWx3 or HxWx4"),
        (np.zeros((20,), np.uint8), "uint8 array [20]"),
        (np.zeros((0, 30), np.uint8), "empty uint8 array [0, 30]"),
        (torch.zeros(20, 30, 3), "a float32 tensor [20, 30, 3]"),
        ("a.png", "it is a str"),
    ],
)
def test_what_is_not_an_image_is_told_why(value: object, says: str) -> None:
    problem = image_problem(value)
    assert problem is not None and says in problem
    typed = isinstance(value, str) or isinstance(value, torch.Tensor)
    kind = UnsupportedTypeError if typed else InvalidArgumentError
    with pytest.raises(kind, match=r"row r1: exp_data\.state\.x is not an image: it is"):
        as_image(value, "row r1: exp_data.state.x")
    assert not looks_like_image(value)


def test_auto_takes_only_images_at_least_the_minimum_side() -> None:
    assert looks_like_image(_pixels(AUTO_MIN_SIDE, AUTO_MIN_SIDE, 3))
    assert not looks_like_image(_pixels(7, 7, 3))  # a grid world's observation
    assert not looks_like_image(_pixels(500, 3))  # a table of bytes
    assert image_problem(_pixels(7, 7, 3)) is None  # still an image when named


def test_describe_image_gives_size_mode_and_digest() -> None:
    array = _pixels(720, 1280, 3)
    assert describe_image(array) == f"image 1280x720 RGB {array_digest(array)[:8]}"
    assert describe_image(_pixels(20, 30)).startswith("image 30x20 L ")


def test_selection_auto_finds_images_in_nested_dicts_in_payload_order() -> None:
    shot, small, thumb = _pixels(40, 60, 3), _pixels(4, 4, 3), _pixels(16, 16)
    row = make_row(
        state={"screenshot": shot, "icons": small, "page": {"thumb": thumb}, "url": "u"},
        ext_info={"obs": np.zeros((32, 32, 3), np.float32)},
    )
    found = list(ImageSelection.parse("auto").find(row))  # type: ignore[union-attr]
    assert [f.where for f in found] == ["state.screenshot", "state.page.thumb"]
    assert found[1].path == ("state", "page", "thumb") and found[0].array is shot


def test_selection_by_path_requires_images_and_skips_rows_without_one() -> None:
    selection = ImageSelection.parse(["state.shot", "exp_data.actions.0.crop"])
    assert selection is not None and not selection.auto
    crop = _pixels(3, 5)  # named: no minimum size
    row = make_row(state={"shot": None}, actions=[{"crop": crop}])
    found = list(selection.find(row))
    assert [(f.where, f.path, f.array is crop) for f in found] == [
        ("actions.0.crop", ("actions", 0, "crop"), True)
    ]
    bad = make_row(state={"shot": np.zeros((8, 8), np.int16)})
    with pytest.raises(InvalidArgumentError, match=rf"row {bad.id}: exp_data\.state\.shot"):
        list(selection.find(bad))


@pytest.mark.parametrize(
    ("images", "says"),
    [
        ([], "images must be 'auto' or a list of field paths"),
        (["exp_meta.step"], "does not name a value inside a payload field"),
        (["exp_data.state"], "does not name a value inside a payload field"),
        ([3], "got 3 in it"),
    ],
)
def test_bad_selections_are_refused(images: object, says: str) -> None:
    with pytest.raises(InvalidArgumentError, match=says):
        ImageSelection.parse(images)  # type: ignore[arg-type]


def test_no_selection_is_none() -> None:
    assert ImageSelection.parse(None) is None


def test_png_without_pillow_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "PIL.Image", None)  # as if Pillow were not installed
    with pytest.raises(MissingDependencyError, match=r"pip install 'expstore\[images\]'"):
        png_bytes(_pixels(4, 4, 3))
    # Telling images and describing them needs no Pillow.
    assert describe_image(_pixels(20, 20, 3)).startswith("image 20x20 RGB ")
