"""Values as a person looks at them: images as PNG (full size or a thumbnail), other arrays
as their dtype and shape with a few values, JSON trees with their arrays described.

Everything here returns plain data or bytes; escaping is the templates' (Jinja2's
autoescape), so a stored ``<script>`` is shown as text wherever it lands.
"""

from __future__ import annotations

import io
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..model.images import looks_like_image, png_bytes, require_pillow, to_pil
from .reads import ArrayRef

__all__ = [
    "THUMB_SIDE",
    "PngCache",
    "array_line",
    "decode_data_url",
    "images_in",
    "preview",
    "short_json",
    "thumbnail",
]

#: The longest side of a thumbnail, in pixels.
THUMB_SIDE = 320
#: The most characters a cell of the rows table shows of a JSON value.
CELL_CHARS = 160


def is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) or type(value).__name__ == "Tensor"


def array_line(value: Any) -> str:
    """``uint8 720x1280x3 image`` or ``float32 [4] 0.1 0.2 0.3 0.4``: what a cell shows of
    an array."""
    array = np.asarray(value.detach().cpu() if type(value).__name__ == "Tensor" else value)
    shape = "x".join(map(str, array.shape)) or "scalar"
    if looks_like_image(value):
        return f"{array.dtype} {shape} image"
    head = array.reshape(-1)[:6]
    shown = " ".join(f"{v:.4g}" if isinstance(v, (float, np.floating)) else str(v) for v in head)
    more = " ..." if array.size > len(head) else ""
    return f"{array.dtype} [{shape}] {shown}{more}"


def preview(value: Any) -> Any:
    """``value`` made JSON-friendly for display: arrays as their line, other values as
    they are (nested)."""
    if is_array(value):
        return f"<{array_line(value)}>"
    if isinstance(value, ArrayRef):
        return str(value)
    if isinstance(value, dict):
        return {str(k): preview(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [preview(v) for v in value]
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    return value


def short_json(value: Any, limit: int = CELL_CHARS) -> str:
    """A value as one line of JSON (arrays described), cut at ``limit`` characters."""
    text = json.dumps(preview(value), ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def images_in(value: Any, path: str) -> Iterator[str]:
    """The paths (dotted, from ``path``) of the image arrays inside ``value``."""
    if looks_like_image(value):
        yield path
    elif isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str) and k and "." not in k:
                yield from images_in(v, f"{path}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value[:50]):
            yield from images_in(v, f"{path}.{i}")


#: The most pixels an image in a message may have for the viewer to decode it.
MAX_DATA_URL_PIXELS = 40_000_000
#: The image types a ``data:`` URL in a message may carry.
DATA_URL_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")


def decode_data_url(url: str, where: str) -> np.ndarray:
    """The image of a ``data:image/...;base64,`` URL (an OpenAI-style image content part)
    as an RGB array, read by Pillow (which refuses decompression bombs);
    InvalidArgumentError for anything else."""
    import base64
    import binascii

    from ..errors import InvalidArgumentError

    head, _, body = url.partition(",")
    kind = head[len("data:") :].split(";")[0]
    if kind not in DATA_URL_TYPES or not head.endswith(";base64"):
        raise InvalidArgumentError(
            f"{where} is a data: URL of {kind or 'no type'}; the viewer shows base64 "
            f"{', '.join(DATA_URL_TYPES)}"
        )
    pil = require_pillow("images in messages")
    try:
        raw = base64.b64decode(body, validate=False)
        with pil.open(io.BytesIO(raw)) as image:
            width, height = image.size
            if width * height > MAX_DATA_URL_PIXELS:
                raise InvalidArgumentError(
                    f"{where} is an image of {width}x{height}; the viewer shows images in "
                    f"messages up to {MAX_DATA_URL_PIXELS:,} pixels"
                )
            return np.asarray(image.convert("RGB"))
    except (binascii.Error, ValueError, OSError, pil.DecompressionBombError) as exc:
        raise InvalidArgumentError(f"{where} is not a readable image ({exc})") from None


def thumbnail(value: Any) -> bytes:
    """A PNG of the image at most :data:`THUMB_SIDE` pixels on its longest side."""
    pil = require_pillow("thumbnails in the viewer")
    image = to_pil(value)
    image.thumbnail((THUMB_SIDE, THUMB_SIDE), pil.Resampling.BILINEAR)
    out = io.BytesIO()
    image.save(out, format="PNG", compress_level=1)
    return out.getvalue()


class PngCache:
    """The PNGs served lately (rows never change once written, so neither do their
    images), up to ``max_bytes``, least recently used first out."""

    def __init__(self, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, ...], bytes] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        #: Requests answered from the cache.
        self.hits = 0

    def peek(self, key: tuple[str, ...]) -> bytes | None:
        """The PNG kept for ``key``, or None."""
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
                self.hits += 1
            return found

    def get(self, key: tuple[str, ...], read: Callable[[], Any], thumb: bool) -> bytes:
        """The PNG (a thumbnail with ``thumb``) of the image ``read()`` returns, made once
        per ``key``: a PNG in the cache costs no read of the database and no encoding."""
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return found
        value = read()
        made = thumbnail(value) if thumb else png_bytes(value)
        with self._lock:
            if key not in self._items:
                self._items[key] = made
                self._size += len(made)
            while self._size > self.max_bytes and len(self._items) > 1:
                _, gone = self._items.popitem(last=False)
                self._size -= len(gone)
        return made
