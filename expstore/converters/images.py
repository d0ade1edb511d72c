"""ImageConverter: stored image arrays as PIL images, CHW float tensors or HWC uint8 arrays."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from .._optional import require
from ..errors import InvalidArgumentError
from ..model.images import as_image, image_problem, require_pillow, to_pil
from ..model.rows import DataRow
from ..storage.base import Fetched, Values
from .arrays import NumpyConverter
from .base import MISSING, Converter, FieldSpec, parse_path, read_path
from .tensors import TensorConverter

__all__ = ["OUTPUTS", "ImageConverter", "Output"]

Output = Literal["chw_float", "hwc_uint8", "pil"]
#: What an :class:`ImageConverter` can hand over.
OUTPUTS: tuple[Output, ...] = ("chw_float", "hwc_uint8", "pil")


class ImageConverter(Converter[dict[str, Any]]):
    """Images of the chosen rows as a model or a viewer takes them, plus other fields.

    ``ImageConverter(images, *, output="chw_float", fields=None, stack=True, device=None)``

    - ``images``: where the images are: a field path (``"exp_data.state.screenshot"``), a
      list of paths (each output named after its last step: ``"screenshot"``) or a dict of
      output name -> path. Each value there must be an image (a uint8 ``HxW``, ``HxWx1``,
      ``HxWx3`` or ``HxWx4`` array, see :mod:`expstore.model.images`); anything else, or a
      row without one, raises an error naming the row and the path.
    - ``output``:

      - ``"chw_float"``: a ``torch.float32`` tensor ``[B, C, H, W]`` (``[C, H, W]`` per
        image with ``stack=False``) scaled to [0, 1], bit for bit what torchvision's
        ``v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])`` makes of the
        array (``x.to(float32).mul_(1 / 255)``; the legacy ``ToTensor``'s ``div(255)``
        differs from it by at most one float32 ulp). An ``HxW`` image has ``C = 1``.
        Needs torch (``expstore[torch]``); on ``device`` when given (the uint8 pixels move
        there first, a quarter of the bytes).
      - ``"hwc_uint8"``: a numpy uint8 array ``[B, H, W, C]`` (``HxW`` gives ``C = 1``).
      - ``"pil"``: a list of ``PIL.Image.Image`` (``L``, ``RGB`` or ``RGBA``), whatever
        ``stack``; needs Pillow (``expstore[images]``).
    - ``stack``: one array or tensor per output (the images of a batch must then share
      their size, or the error says to pass ``stack=False``); ``False`` gives a list.
    - ``fields``: other outputs (name -> path or function of the row), built as
      :class:`NumpyConverter` builds them, as tensors (:class:`TensorConverter`, on
      ``device``) when ``output="chw_float"``.

    Only the named paths are fetched (no whole rows) unless a field is a function.

    >>> conv = ImageConverter("exp_data.state.screenshot",
    ...                       fields={"action": "exp_data.actions.0.id",
    ...                               "reward": "exp_data.reward_t"})
    """

    #: Every output is made from a copy of the stored pixels.
    copies_arrays = True

    def __init__(
        self,
        images: str | Sequence[str] | Mapping[str, str],
        *,
        output: Output = "chw_float",
        fields: Mapping[str, FieldSpec] | None = None,
        stack: bool = True,
        device: Any = None,
    ) -> None:
        if output not in OUTPUTS:
            raise InvalidArgumentError(
                f"output must be one of {', '.join(map(repr, OUTPUTS))}, got {output!r}"
            )
        self.images = _named(images)
        self.output: Output = output
        self.stack = bool(stack)
        self.device: Any = None
        if output == "chw_float":
            torch = require("torch", 'ImageConverter(output="chw_float")')
            self.device = None if device is None else torch.device(device)
        elif device is not None:
            raise InvalidArgumentError(
                f'device applies to output="chw_float" (torch tensors); output={output!r} '
                "gives numpy arrays or PIL images"
            )
        if output == "pil":
            require_pillow('ImageConverter(output="pil")')
        self.fields: dict[str, FieldSpec] = dict(fields or {})
        clash = sorted(set(self.fields) & set(self.images))
        if clash:
            raise InvalidArgumentError(
                f"fields and images both name {clash}; give each output a name of its own"
            )
        self._rest: NumpyConverter | None = None
        if self.fields:
            maker = TensorConverter if output == "chw_float" else NumpyConverter
            kwargs = {"device": device} if output == "chw_float" else {}
            self._rest = maker(self.fields, **kwargs)

    @property
    def paths(self) -> list[str] | None:
        """The image paths then the other fields' paths; None if a field is a function of
        the row (then whole rows are fetched)."""
        rest = [] if self._rest is None else self._rest.paths
        if rest is None:
            return None
        return [*self.images.values(), *rest]

    def to_dataset_row(self, rows: Sequence[DataRow]) -> dict[str, Any]:
        ids = [row.id for row in rows]
        out = {
            name: self.convert(name, [read_path(row, path) for row in rows], ids)
            for name, path in self.images.items()
        }
        if self._rest is not None:
            out.update(self._rest.to_dataset_row(rows))
        return out

    def build(self, fetched: Fetched) -> dict[str, Any]:
        if fetched.columns is None:
            return super().build(fetched)
        count = len(self.images)
        out = {
            name: self.convert(name, values, fetched.ids)
            for name, values in zip(self.images, fetched.columns[:count], strict=True)
        }
        if self._rest is not None:
            rest = dict(zip(self.fields, fetched.columns[count:], strict=True))
            out.update(self._rest.from_values(rest))
        return out

    def convert(self, name: str, values: Values, ids: Sequence[str]) -> Any:
        """One output from its images over the rows (``ids`` name them in errors)."""
        path = self.images[name]
        if isinstance(values, np.ndarray) and values.dtype == np.uint8 and values.ndim >= 3:
            problem = image_problem(values[0]) if len(values) else None
            if problem is None:  # already stacked: [B, H, W] or [B, H, W, C]
                return self._from_stacked(name, values)
        arrays = []
        for row_id, value in zip(ids, values, strict=True):
            if value is MISSING or value is None:
                raise InvalidArgumentError(
                    f"row {row_id} has no image at {path}; every row of an ImageConverter's "
                    "batch needs one (filter with --where/QueryBuilder: "
                    f"'{path} is not null')"
                )
            arrays.append(as_image(value, f"row {row_id}: {path}"))
        if self.output == "pil":
            return [to_pil(a) for a in arrays]
        hwc = [a if a.ndim == 3 else a[:, :, None] for a in arrays]
        if not self.stack:
            if self.output == "hwc_uint8":
                return [np.array(a) for a in hwc]  # each a writable copy of its own
            return [self._chw(a[None])[0] for a in hwc]
        sizes = {a.shape for a in hwc}
        if len(sizes) > 1:
            shown = ", ".join(f"{w}x{h}x{c}" for h, w, c in sorted(sizes)[:4])
            raise InvalidArgumentError(
                f"the images at {path} have different sizes in this batch ({shown}); they "
                "cannot be stacked: pass stack=False for a list per output, or resize them "
                "before storing"
            )
        return self._from_stacked(name, np.stack(hwc) if hwc else np.zeros((0, 0, 0, 1), "u1"))

    def _from_stacked(self, name: str, batch: np.ndarray) -> Any:
        """The output from stacked images ``[B, H, W]`` or ``[B, H, W, C]`` (uint8)."""
        if batch.ndim == 3:
            batch = batch[:, :, :, None]
        if self.output == "pil":
            return [to_pil(image) for image in batch]
        if self.output == "hwc_uint8":
            if not batch.flags.writeable or not batch.flags.c_contiguous:
                batch = np.ascontiguousarray(batch).copy()  # a view of the fetched bytes
            return batch if self.stack else list(batch)
        tensor = self._chw(batch)
        return tensor if self.stack else list(tensor.unbind(0))

    def _chw(self, batch: np.ndarray) -> Any:
        """``[B, H, W, C]`` uint8 -> ``[B, C, H, W]`` float32 in [0, 1], as torchvision's
        ``to_dtype_image`` scales integers: ``image.to(float32).mul_(1.0 / 255)``; done as
        one pass that converts and transposes into the output, then the scaling in place
        (the fastest of the orders measured; the values are the same)."""
        torch = require("torch", 'ImageConverter(output="chw_float")')
        with warnings.catch_warnings():  # a read-only view of the fetched bytes: only read
            warnings.simplefilter("ignore", UserWarning)
            pixels = torch.from_numpy(batch)
        if self.device is not None:
            pixels = pixels.to(self.device)
        count, height, width, channels = pixels.shape
        out = torch.empty(
            (count, channels, height, width), dtype=torch.float32, device=pixels.device
        )
        out.copy_(pixels.permute(0, 3, 1, 2))
        return out.mul_(1.0 / 255)

    def convert_info(self, info: dict[str, Any]) -> dict[str, Any]:
        """A sampler's numeric extras (``weights``) as tensors on ``device`` with
        ``output="chw_float"``, as numpy arrays otherwise; ``ids`` stay a list."""
        if self.output != "chw_float":
            return dict(info)
        torch = require("torch", 'ImageConverter(output="chw_float")')
        return {
            name: torch.from_numpy(np.array(value)).to(self.device)
            if isinstance(value, np.ndarray)
            else value
            for name, value in info.items()
        }


def _named(images: str | Sequence[str] | Mapping[str, str]) -> dict[str, str]:
    """Output name -> canonical path, checked."""
    if isinstance(images, str):
        images = [images]
    pairs: list[tuple[str | None, Any]]
    if isinstance(images, Mapping):
        pairs = list(images.items())
    elif isinstance(images, Sequence):
        pairs = [(None, path) for path in images]
    else:
        pairs = []
    if not pairs:
        raise InvalidArgumentError(
            "images must be a field path, a list of paths or a dict of output name -> path, "
            "e.g. 'exp_data.state.screenshot'"
        )
    out: dict[str, str] = {}
    for name, text in pairs:
        if not isinstance(text, str):
            raise InvalidArgumentError(f"an image path must be a string, got {text!r}")
        path = parse_path(text)
        if path.column is not None or not path.steps:
            raise InvalidArgumentError(
                f"{text!r} does not name a value inside a payload field; name where the "
                "image is, such as 'exp_data.state.screenshot'"
            )
        key = str(path.steps[-1]) if name is None else name
        if not isinstance(key, str) or not key:
            raise InvalidArgumentError(f"output names must be non-empty strings, got {key!r}")
        if key in out:
            raise InvalidArgumentError(
                f"two image paths would both be named {key!r}; give a dict of output name -> path"
            )
        out[key] = path.canonical
    return out
