"""Arrays stored by digest: how one array's bytes are compressed, chosen per array, and
read back without trusting anything the stored bytes say.

An array of at least :data:`EXTERNAL_THRESHOLD` bytes is not kept in its row's blob: the
row's placeholder names its digest (:func:`~expstore.codec.digests.array_digest`), and the
array is stored once per buffer, as the bytes :func:`pack_array` makes::

    offset 0: 4 bytes  magic b"XSA1"
    offset 4: 4 bytes  CRC-32, little-endian, of bytes 8.., seeded with the CRC-32 of the
                       digest (ASCII), so stored bytes moved to another digest no longer match
    offset 8: 1 byte   the codec: 0 raw, 1 zstd, 2 zstd of the byte-shuffled array, 3 PNG,
                       4 WebP lossless
    offset 9: 7 bytes  zero
    offset 16: the stream

The buffer's ``compression`` setting picks the codec of each new array:

- ``"zstd"``: zstd (level 3); for a dtype of more than one byte, of the array byte-shuffled
  (all first bytes, then all second bytes...) when a trial on its first 256 KiB says that
  is smaller;
- ``"auto"`` (the default): as ``"zstd"``, and for a uint8 ``HxW``, ``HxWx3`` or ``HxWx4``
  array that zstd leaves above a quarter of its size (photographs rather than pages), PNG
  when Pillow is installed and PNG is at most three quarters of zstd's size (measured on
  real page screenshots: zstd 3.7% of the raw bytes at 900 MB/s, PNG 6.7% at 85 MB/s, so
  pages stay with zstd);
- ``"png"``, ``"webp"``: that image codec (lossless) for image arrays, zstd for any other
  array (silently, losslessly);
- None: the raw bytes (stored once all the same); zstd output no smaller than the array
  is stored raw too.

Reading checks the CRC, then decodes into exactly the bytes the placeholder's shape and
dtype make, never more: a zstd frame must declare that content size, an image that width,
height and mode. Anything else is a :class:`~expstore.errors.CorruptRowError`.
"""

from __future__ import annotations

import io
import math
import threading
from typing import Any, Final

import numpy as np

from .._optional import require
from ..errors import CorruptRowError, InvalidArgumentError, MissingDependencyError
from .format import CRC, crc32

__all__ = [
    "ARRAY_HEADER",
    "ARRAY_MAGIC",
    "COMPRESSIONS",
    "DEFAULT_MAX_ARRAY_BYTES",
    "EXTERNAL_THRESHOLD",
    "Unpacked",
    "check_compression",
    "pack_array",
    "unpack_array",
]

#: Arrays (numpy and torch) of at least this many bytes are stored by digest.
EXTERNAL_THRESHOLD: Final = 64 * 1024
#: The largest array a buffer stores unless told otherwise (``max_array_bytes``): an
#: incompressible one still fits the 1 GB limit of a SQLite blob and a Postgres bytea.
DEFAULT_MAX_ARRAY_BYTES: Final = 512 << 20
#: The values of a buffer's ``compression`` setting.
COMPRESSIONS: Final = ("auto", "zstd", "png", "webp", None)

ARRAY_MAGIC: Final = b"XSA1"
ARRAY_HEADER: Final = 16
RAW, ZSTD, ZSTD_SHUFFLED, PNG, WEBP = range(5)
CODEC_NAMES: Final = {
    RAW: "raw",
    ZSTD: "zstd",
    ZSTD_SHUFFLED: "zstd+shuffle",
    PNG: "png",
    WEBP: "webp",
}
_ZSTD_LEVEL = 3
_TRIAL_BYTES = 256 * 1024
_IMAGE_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
_WEBP_MAX_SIDE = 16383
_local = threading.local()


class Unpacked:
    """An array already unpacked from its stored bytes (a batch unpacks the arrays its rows
    share once, in threads); the decoder views it as the row's array."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray[Any, Any]) -> None:
        self.array = array


def check_compression(compression: Any) -> str | None:
    """``compression`` if it is one of :data:`COMPRESSIONS`, else InvalidArgumentError; an
    image codec needs Pillow (MissingDependencyError naming the extra)."""
    if compression not in COMPRESSIONS or not (compression is None or type(compression) is str):
        raise InvalidArgumentError(
            f"compression must be one of {', '.join(map(repr, COMPRESSIONS))}, "
            f"got {compression!r}. Nothing was changed"
        )
    if compression in ("png", "webp"):
        require("PIL", f"compression={compression!r}")
    return compression  # type: ignore[no-any-return]


def _zstd() -> Any:
    return require("zstandard", "compressing arrays")


def _compressor() -> Any:
    cctx = getattr(_local, "cctx", None)
    if cctx is None:  # a context per thread: one may not be used by two threads at once
        cctx = _local.cctx = _zstd().ZstdCompressor(level=_ZSTD_LEVEL, write_content_size=True)
    return cctx


def _shuffled(data: np.ndarray[Any, Any], itemsize: int) -> bytes:
    return data.reshape(-1).view(np.uint8).reshape(-1, itemsize).T.tobytes()


def _image_mode(array: np.ndarray[Any, Any]) -> str | None:
    if array.dtype != np.uint8 or array.ndim not in (2, 3) or 0 in array.shape:
        return None
    if array.ndim == 2:
        return "L"
    return _IMAGE_MODES.get(array.shape[2]) if array.shape[2] != 1 else None


def _image(array: np.ndarray[Any, Any], fmt: int) -> bytes | None:
    """The PNG or WebP (lossless) bytes of an image array, or None when Pillow is missing or
    the format cannot hold it."""
    mode = _image_mode(array)
    if mode is None:
        return None
    try:
        from PIL import Image
    except ImportError:
        return None
    if fmt == WEBP and (max(array.shape[:2]) > _WEBP_MAX_SIDE or mode == "L"):
        return None  # (WebP has no grayscale: it would come back as RGB)
    out = io.BytesIO()
    image = Image.fromarray(array, mode)
    if fmt == PNG:
        image.save(out, "PNG", compress_level=1)
    else:
        image.save(out, "WEBP", lossless=True, quality=0, method=0, exact=True)
    return out.getvalue()


def _zstd_stream(data: np.ndarray[Any, Any]) -> tuple[int, bytes]:
    """(codec, stream) of zstd over the array's bytes, or over them byte-shuffled when a
    trial on their start says that is smaller."""
    cctx = _compressor()
    itemsize = data.dtype.itemsize
    flat = data.reshape(-1)
    if itemsize > 1 and flat.size:
        trial = flat[: max(1, _TRIAL_BYTES // itemsize)]
        plain = len(cctx.compress(trial.tobytes()))
        if len(cctx.compress(_shuffled(trial, itemsize))) < plain:
            return ZSTD_SHUFFLED, cctx.compress(_shuffled(flat, itemsize))
    return ZSTD, cctx.compress(_bytes_of(flat))


def _bytes_of(data: np.ndarray[Any, Any]) -> memoryview:
    """The bytes of a C-contiguous array, without a copy."""
    return memoryview(data.reshape(-1).view(np.uint8))  # type: ignore[arg-type]


def pack_array(data: np.ndarray[Any, Any], digest: str, compression: str | None) -> bytes:
    """The stored bytes of ``data`` (a C-contiguous little-endian array whose digest is
    ``digest``) under the buffer's ``compression`` (see the module doc)."""
    codec, stream = RAW, _bytes_of(data)
    if compression is not None:
        if compression in ("png", "webp"):
            fmt = PNG if compression == "png" else WEBP
            image = _image(data, fmt)
            if image is not None:
                codec, stream = fmt, memoryview(image)
        if codec == RAW:
            codec, packed = _zstd_stream(data)
            stream = memoryview(packed)
            if (
                compression == "auto"
                and len(packed) * 4 > data.nbytes
                and _image_mode(data) is not None
            ):
                image = _image(data, PNG)
                if image is not None and len(image) * 4 <= len(packed) * 3:
                    codec, stream = PNG, memoryview(image)
            if codec != PNG and len(stream) >= data.nbytes:  # incompressible: kept raw
                codec, stream = RAW, _bytes_of(data)
    head = bytes([codec]) + bytes(7)
    crc = crc32(stream, crc32(head, crc32(digest.encode("ascii"))))
    return b"".join([ARRAY_MAGIC, CRC.pack(crc), head, stream])


def stored_codec(stored: bytes | memoryview) -> str:
    """The name of the codec stored bytes use (``zstd``, ``png``...), or ``?``."""
    return CODEC_NAMES.get(stored[8], "?") if len(stored) >= ARRAY_HEADER else "?"


def unpack_array(
    stored: Any, digest: str, dtype: np.dtype[Any], shape: tuple[int, ...], where: str
) -> np.ndarray[Any, Any]:
    """The writable array of ``dtype`` and ``shape`` that ``stored`` (what
    :func:`pack_array` made for ``digest``) holds; CorruptRowError (naming ``where``) if
    the bytes are damaged, cut, inflated or do not hold exactly such an array."""

    def corrupt(problem: str) -> CorruptRowError:
        return CorruptRowError(
            f"{where}: the stored array {digest} {problem}; it cannot be read. Delete the "
            "rows that refer to it and store them again"
        )

    if not isinstance(stored, (bytes, bytearray, memoryview)):
        raise corrupt(f"is a {type(stored).__name__}, not bytes")
    view = memoryview(stored).cast("B")
    if len(view) < ARRAY_HEADER or bytes(view[:4]) != ARRAY_MAGIC:
        raise corrupt("does not start with the array header")
    (expected_crc,) = CRC.unpack(view[4:8])
    if crc32(view[8:], crc32(digest.encode("ascii"))) != expected_crc:
        raise corrupt("does not match its checksum (damaged, cut, or another array's)")
    codec = view[8]
    stream = view[ARRAY_HEADER:]
    size = math.prod(shape)
    nbytes = size * dtype.itemsize
    try:
        if codec == RAW:
            if len(stream) != nbytes:
                raise corrupt(f"holds {len(stream)} bytes, not the {nbytes} of its shape")
            out = np.frombuffer(bytearray(stream), dtype, size)
        elif codec in (ZSTD, ZSTD_SHUFFLED):
            out = _unzstd(stream, nbytes, dtype, size, codec == ZSTD_SHUFFLED, corrupt)
        elif codec in (PNG, WEBP):
            return _unimage(stream, codec, dtype, shape, corrupt)
        else:
            raise corrupt(f"names codec {codec}, which this expstore does not know")
    except (CorruptRowError, MissingDependencyError):
        raise
    except Exception as exc:  # a foreign decoder's error on bytes that passed the CRC
        raise corrupt(f"cannot be decoded ({type(exc).__name__}: {exc})") from None
    return out.reshape(shape)


def _unzstd(
    stream: memoryview, nbytes: int, dtype: np.dtype[Any], size: int, shuffled: bool, corrupt: Any
) -> np.ndarray[Any, Any]:
    zstandard = _zstd()
    declared = zstandard.frame_content_size(stream)
    if declared != nbytes:  # checked before anything is allocated
        raise corrupt(f"declares {declared} bytes, not the {nbytes} of its shape")
    raw = zstandard.ZstdDecompressor().decompress(stream, max_output_size=nbytes)
    if len(raw) != nbytes:
        raise corrupt(f"decodes to {len(raw)} bytes, not the {nbytes} of its shape")
    if shuffled and dtype.itemsize > 1:
        table = np.frombuffer(raw, np.uint8).reshape(dtype.itemsize, -1)
        return np.ascontiguousarray(table.T).view(dtype).reshape(size)
    return np.frombuffer(bytearray(raw), dtype, size)


def _unimage(
    stream: memoryview, codec: int, dtype: np.dtype[Any], shape: tuple[int, ...], corrupt: Any
) -> np.ndarray[Any, Any]:
    image_module = require("PIL.Image", "reading an array stored as an image")
    mode = None
    if dtype == np.uint8 and len(shape) == 2:
        mode = "L"
    elif dtype == np.uint8 and len(shape) == 3:
        mode = _IMAGE_MODES.get(shape[2])
    if mode is None:
        raise corrupt(f"is an image, but its placeholder says {dtype} {list(shape)}")
    image = image_module.open(io.BytesIO(stream), formats=["PNG" if codec == PNG else "WEBP"])
    if image.size != (shape[1], shape[0]) or image.mode != mode:
        # checked on the header, before any pixel is decoded
        raise corrupt(
            f"is a {image.mode} image of {image.size[0]}x{image.size[1]}, not the "
            f"{mode} {shape[1]}x{shape[0]} of its placeholder"
        )
    image.load()
    out = np.asarray(image)
    if out.shape != shape or out.dtype != np.uint8:
        raise corrupt(f"decodes to {out.dtype} {list(out.shape)}, not {list(shape)}")
    return out if out.flags.writeable else out.copy()
