"""Images: which stored arrays are images, and an image as PNG bytes, a PIL image or a line.

An **image** is a uint8 array laid out channels-last: ``HxW`` (grayscale, PIL mode ``L``),
``HxWx1`` (grayscale too), ``HxWx3`` (``RGB``) or ``HxWx4`` (``RGBA``), as numpy holds
screenshots and as Pillow, Hugging Face ``datasets`` and gym environments give them. A
uint8 torch tensor of that layout counts too (channels-first ``3xHxW`` does not: its
hint says so). Nothing about how a row is *stored* depends on this: these are views of
stored arrays, used by the Parquet export's image features, ``expstore export --images``,
:class:`~expstore.converters.ImageConverter` and the CLI's row tables.

Which arrays are images is chosen one of two ways (:class:`ImageSelection`):

- named paths (``["exp_data.state.screenshot"]``): the value at each path must be an
  image (any size), or absent; anything else is an error that names the row and the path;
- ``"auto"``: every image array at a dict path of the payload whose height and width are
  both at least :data:`AUTO_MIN_SIDE` pixels (so a 7x7x3 grid-world observation or a
  ``(N, 3)`` table of bytes stays an array). A mistaken guess costs nothing: the view is
  lossless (PNG) and the row's own bytes are never changed.

Pillow is optional (``pip install 'expstore[images]'``): PNG bytes and PIL images need it,
telling which arrays are images and :func:`describe_image` do not.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .._optional import loaded_torch, require
from ..codec import array_digest
from ..errors import InvalidArgumentError, UnsupportedTypeError
from .layout import PAYLOAD_FIELDS
from .paths import MISSING, FieldPath, parse_path, walk
from .rows import DataRow

__all__ = [
    "AUTO",
    "AUTO_MIN_SIDE",
    "MODES",
    "Found",
    "ImageSelection",
    "as_image",
    "describe_image",
    "from_png",
    "image_problem",
    "looks_like_image",
    "png_bytes",
    "require_pillow",
    "to_pil",
]

#: The selection that finds images by their dtype and shape.
AUTO = "auto"
#: ``"auto"`` takes an image array only when its height and width are both at least this.
AUTO_MIN_SIDE = 16
#: PIL's mode for each number of channels (an ``HxW`` array has one).
MODES = {1: "L", 3: "RGB", 4: "RGBA"}
#: zlib's level for PNG. On screenshots of real pages level 1 was both faster (28 ms
#: against 40 for a 720p page) and smaller (6.1% of the pixels against 6.6%) than Pillow's
#: default 6 (``benchmarks/bench_images.py``); any level decodes the same.
PNG_LEVEL = 1
#: How deep into dicts ``"auto"`` looks for images (as :mod:`expstore.model.arrow` does).
_DEPTH = 6


def _numpy(value: Any) -> np.ndarray | None:
    """A numpy array or a CPU copy of a torch tensor; None for anything else."""
    if isinstance(value, np.ndarray):
        return value
    torch = loaded_torch()
    if torch is not None and isinstance(value, torch.Tensor):
        if value.dtype != torch.uint8:
            return None
        array: np.ndarray = value.detach().cpu().numpy()
        return array
    return None


def image_problem(value: Any) -> str | None:
    """Why ``value`` is not an image (a sentence), or None when it is one."""
    array = _numpy(value)
    if array is None:
        torch = loaded_torch()
        if torch is not None and isinstance(value, torch.Tensor):
            what = f"a {str(value.dtype).removeprefix('torch.')} tensor {list(value.shape)}"
        else:
            what = f"a {type(value).__name__}"
        return f"it is {what}; an image is a uint8 array (HxW, HxWx3 or HxWx4)"
    shape = list(array.shape)
    if array.dtype != np.uint8:
        return (
            f"it is a {array.dtype} array {shape}; an image is uint8 (HxW, HxWx3 or HxWx4), "
            "0-255 per channel"
        )
    channels_last = array.ndim == 2 or (array.ndim == 3 and array.shape[2] in MODES)
    if not channels_last:
        hint = ""
        if array.ndim == 3 and array.shape[0] in MODES:
            hint = " (it looks channels-first, CxHxW: store images channels-last, HxWxC)"
        return f"it is a uint8 array {shape}; an image is HxW, HxWx1, HxWx3 or HxWx4{hint}"
    if 0 in array.shape[:2]:
        return f"it is an empty uint8 array {shape}; an image has at least one pixel"
    return None


def as_image(value: Any, where: str = "the value") -> np.ndarray:
    """``value`` as a numpy image array (a torch tensor copied to the CPU); an error of the
    right kind naming ``where`` when it is not an image."""
    problem = image_problem(value)
    if problem is not None:
        kind = InvalidArgumentError if _numpy(value) is not None else UnsupportedTypeError
        raise kind(f"{where} is not an image: {problem}")
    array = _numpy(value)
    assert array is not None
    return array


def looks_like_image(value: Any) -> bool:
    """Whether ``"auto"`` takes ``value`` for an image: an image array at least
    :data:`AUTO_MIN_SIDE` pixels high and wide."""
    if image_problem(value) is not None:
        return False
    shape = value.shape
    return bool(shape[0] >= AUTO_MIN_SIDE and shape[1] >= AUTO_MIN_SIDE)


def mode(array: np.ndarray) -> str:
    """PIL's mode for an image array: ``L``, ``RGB`` or ``RGBA``."""
    return MODES[1 if array.ndim == 2 else array.shape[2]]


def describe_image(value: Any) -> str:
    """An image in one line: ``image 1280x720 RGB 3fa2c1d0`` (width x height, the mode and
    the first 8 hex digits of its :func:`~expstore.codec.array_digest`)."""
    array = as_image(value)
    height, width = array.shape[:2]
    return f"image {width}x{height} {mode(array)} {array_digest(array)[:8]}"


def require_pillow(purpose: str = "images (PNG bytes and PIL images)") -> Any:
    """``PIL.Image``, or MissingDependencyError naming the ``images`` extra."""
    return require("PIL.Image", purpose)


def _pil() -> Any:
    return require_pillow()


def to_pil(value: Any, where: str = "the value") -> Any:
    """An image array as a ``PIL.Image.Image`` (mode ``L``, ``RGB`` or ``RGBA``; an
    ``HxWx1`` array gives ``L``). Needs Pillow."""
    array = as_image(value, where)
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    return _pil().fromarray(np.ascontiguousarray(array))


def png_bytes(value: Any, where: str = "the value", *, level: int = PNG_LEVEL) -> bytes:
    """An image array as a PNG file's bytes (lossless). Needs Pillow."""
    out = io.BytesIO()
    to_pil(value, where).save(out, format="PNG", compress_level=level)
    return out.getvalue()


def from_png(data: bytes) -> np.ndarray:
    """The image array a PNG (or any image Pillow reads) holds: ``HxW`` for ``L``,
    ``HxWx3`` for ``RGB``, ``HxWx4`` for ``RGBA``. Needs Pillow."""
    with _pil().open(io.BytesIO(data)) as image:
        return np.asarray(image)


@dataclass(frozen=True)
class ImageSelection:
    """Which arrays of a row are images: ``"auto"`` or named payload paths.

    ``ImageSelection.parse("auto")``, ``ImageSelection.parse(["exp_data.state.screenshot"])``
    or one path as a string; None gives None (no images asked for).
    """

    #: The named paths, or None for ``"auto"``.
    paths: tuple[FieldPath, ...] | None

    @classmethod
    def parse(cls, images: str | Sequence[str] | None) -> ImageSelection | None:
        if images is None:
            return None
        if isinstance(images, str):
            if images == AUTO:
                return cls(None)
            images = [images]
        if not isinstance(images, Sequence) or not images:
            raise InvalidArgumentError(
                f"images must be {AUTO!r} or a list of field paths such as "
                f"['exp_data.state.screenshot'], got {images!r}"
            )
        paths: list[FieldPath] = []
        for text in images:
            if not isinstance(text, str):
                raise InvalidArgumentError(
                    f"images must be {AUTO!r} or a list of field paths, got {text!r} in it"
                )
            path = parse_path(text)
            if path.column is not None or not path.steps:
                raise InvalidArgumentError(
                    f"images: {text!r} does not name a value inside a payload field; name "
                    "where the image is, such as 'exp_data.state.screenshot'"
                )
            if path not in paths:
                paths.append(path)
        return cls(tuple(paths))

    @property
    def auto(self) -> bool:
        return self.paths is None

    def find(self, row: DataRow) -> Iterator[Found]:
        """The images of ``row``, in payload order for ``"auto"``, in the order named
        otherwise. A named path whose value is not an image raises InvalidArgumentError or
        UnsupportedTypeError naming the row."""
        if self.paths is None:
            for name in PAYLOAD_FIELDS:
                value = getattr(row.exp_data, name)
                if isinstance(value, dict):
                    yield from _auto(value, (name,))
            return
        for path in self.paths:
            assert path.top is not None
            value = walk(getattr(row.exp_data, path.top), path.steps)
            if value is MISSING or value is None:
                continue
            where = f"row {row.id}: {path.canonical}"
            yield Found((path.top, *path.steps), as_image(value, where))


class Found(NamedTuple):
    """An image of a row: where (the payload field, then the dict keys and list indexes
    into it) and the array."""

    path: tuple[str | int, ...]
    array: np.ndarray

    @property
    def where(self) -> str:
        """The path without ``exp_data.``: ``state.screenshot``."""
        return ".".join(map(str, self.path))


def short(path: FieldPath) -> str:
    """A payload path without its ``exp_data.`` prefix: ``state.screenshot``."""
    return path.canonical.removeprefix("exp_data.")


def _auto(value: dict[Any, Any], path: tuple[str, ...]) -> Iterator[Found]:
    for key, item in value.items():
        if not isinstance(key, str):
            continue
        if isinstance(item, dict):
            if len(path) + 1 < _DEPTH:
                yield from _auto(item, (*path, key))
        elif looks_like_image(item):
            array = _numpy(item)
            assert array is not None
            yield Found((*path, key), array)
