"""The stored format: what a document's placeholders look like and how the blob is laid out.

A row's payload is stored as a JSON document plus one blob. In the document, everything
JSON cannot hold is a placeholder, a dict with a single reserved key::

    {"__tensor__": {"kind": "numpy", "dtype": "<f4", "shape": [2, 3], "offset": 0, "nbytes": 24}}
    {"__tensor__": {"kind": "numpy", "dtype": "|u1", "shape": [720, 1280, 3], "digest": "9f..."}}
    {"__float__": "nan"}                      # also "inf", "-inf", "-0.0" and floats of
                                              # magnitude >= 1e16 ("1e+20"), which a
                                              # JSONB number would bring back as 0.0 or int
    {"__escaped__": {"__float__": 1}}         # a user dict that happens to use a reserved key

The blob is ``b"XST2"``, the little-endian CRC-32 of the row's id (UTF-8) followed by the
rest, then every tensor's bytes (``b"XST1"`` blobs, written before, checksum the rest only),
each starting at a multiple of 8 from the end of that 8-byte header. ``kind`` is ``numpy``
(an array), ``npscalar`` (a numpy scalar), ``torch`` (a tensor; ``dtype`` is the torch dtype
name, stored as the bytes of the numpy dtype in :data:`TORCH_DTYPES`) or ``bytes``.
An array of :data:`~expstore.codec.compression.EXTERNAL_THRESHOLD` bytes or more, written
by a buffer, is not in the blob: its placeholder names its digest instead of an offset, and
its bytes (compressed) are stored once per buffer by that digest (see
:mod:`expstore.codec.compression`). ``docs/format.md`` describes the same for readers in
other languages.

Dtypes are read back only through the tables here, so a stored document can never name an
object, string or structured dtype, and nothing is ever unpickled.
"""

from __future__ import annotations

import math
import struct
from typing import Any, NamedTuple, TypeGuard

import numpy as np

try:  # ISA-L's CRC-32: the same checksum as zlib's, three to four times faster
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency; zlib gives the same values
    from zlib import crc32

__all__ = [
    "ALIGNMENT",
    "ESCAPED_KEY",
    "FLOAT_KEY",
    "HEADER_SIZE",
    "LEGACY_MAGIC",
    "MAGIC",
    "RESERVED_KEYS",
    "TAGGED_MAGNITUDE",
    "TENSOR_KEY",
    "TensorSpec",
    "blob_checksum",
    "crc32",
    "intact",
    "row_seed",
    "tagged_float",
    "tagged_value",
]

#: The blob's first four bytes: ``XST2`` for a blob whose checksum also covers its row's id
#: (written since schema revision 0005; a blob moved to another row no longer matches), or
#: ``XST1`` for one written before, whose checksum covers its bytes only (still read).
MAGIC = b"XST2"
LEGACY_MAGIC = b"XST1"
HEADER_SIZE = 8
CRC = struct.Struct("<I")  # the header's checksum field
CRC_DTYPE = np.dtype("<u4")  # the same field, as numpy reads it
MAGIC_BYTES = np.frombuffer(MAGIC, np.uint8)
LEGACY_MAGIC_BYTES = np.frombuffer(LEGACY_MAGIC, np.uint8)
ALIGNMENT = 8
PADDING = [bytes(n) for n in range(ALIGNMENT)]

TENSOR_KEY = "__tensor__"
FLOAT_KEY = "__float__"
ESCAPED_KEY = "__escaped__"
RESERVED_KEYS = frozenset({TENSOR_KEY, FLOAT_KEY, ESCAPED_KEY})

TENSOR_FIELDS = frozenset({"kind", "dtype", "shape", "offset", "nbytes"})
#: The fields of a placeholder of an array stored by digest (outside the row's blob, see
#: :mod:`expstore.codec.compression`).
EXTERNAL_FIELDS = frozenset({"kind", "dtype", "shape", "digest"})
EXTERNAL_KINDS = frozenset({"numpy", "torch"})
TENSOR_KINDS = frozenset({"numpy", "npscalar", "torch", "bytes"})
NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
#: Floats stored as a placeholder although JSON could hold them: Postgres keeps JSON numbers
#: as ``numeric``, which has no negative zero and writes 1e20 back without a decimal point
#: (read as an int). From this magnitude on Python writes floats with an exponent.
TAGGED_MAGNITUDE = 1e16


def tagged_float(value: float) -> bool:
    """Whether a float is stored as a ``__float__`` placeholder (see the module doc)."""
    return (
        not math.isfinite(value)
        or abs(value) >= TAGGED_MAGNITUDE
        or (value == 0.0 and math.copysign(1.0, value) < 0)
    )


def tagged_value(spec: Any) -> float | None:
    """The float a ``__float__`` placeholder holds, or None if it holds no valid one."""
    if not isinstance(spec, str):
        return None
    if spec in NON_FINITE:
        return NON_FINITE[spec]
    try:
        value = float(spec)
    except ValueError:
        return None
    return value if tagged_float(value) and repr(value) == spec else None


# numpy dtypes are stored as little-endian dtype strings and read back only through this
# table. longdouble is platform-dependent ('<f16' on x86-64 Linux, '<f8' on Windows).
_NUMPY_TYPES = (
    np.bool_,
    np.int8, np.int16, np.int32, np.int64,
    np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64, np.longdouble,
    np.complex64, np.complex128, np.clongdouble,
)  # fmt: skip
NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    np.dtype(t).newbyteorder("<").str: np.dtype(t).newbyteorder("<") for t in _NUMPY_TYPES
}
NUMERIC_KINDS = frozenset("biufc")
# The stored (little-endian) dtype of each storable dtype already in that byte order: the
# common case skips the checks in checks.numpy_problem.
STORED_DTYPE: dict[np.dtype[Any], np.dtype[Any]] = {
    d: d for d in NUMPY_DTYPES.values() if d.byteorder in "<|=" or d.itemsize == 1
}
FAST_DTYPE_NAMES: dict[np.dtype[Any], str] = {d: d.str for d in STORED_DTYPE}

# torch dtype name -> (numpy dtype of the stored bytes, torch dtype to view those bytes as
# when numpy has no equivalent). Only names in this table are ever looked up on torch.
TORCH_DTYPES: dict[str, tuple[str, str | None]] = {
    "bool": ("|b1", None),
    "uint8": ("|u1", None),
    "int8": ("|i1", None),
    "int16": ("<i2", None),
    "int32": ("<i4", None),
    "int64": ("<i8", None),
    "uint16": ("<u2", None),
    "uint32": ("<u4", None),
    "uint64": ("<u8", None),
    "float16": ("<f2", None),
    "float32": ("<f4", None),
    "float64": ("<f8", None),
    "complex64": ("<c8", None),
    "complex128": ("<c16", None),
    "bfloat16": ("<i2", "int16"),
    "float8_e4m3fn": ("|u1", "uint8"),
    "float8_e4m3fnuz": ("|u1", "uint8"),
    "float8_e5m2": ("|u1", "uint8"),
    "float8_e5m2fnuz": ("|u1", "uint8"),
}

DAMAGED = "the stored tensor data is damaged or truncated; delete and re-store the row"
MALFORMED = "the stored document is damaged; delete and re-store the row"


class TensorSpec(NamedTuple):
    """A tensor placeholder, checked: everything about it that does not need the blob."""

    kind: str  # numpy, npscalar, torch or bytes
    dtype_name: str  # as stored: '<f4', or a torch dtype name
    dtype: np.dtype[Any]  # of the stored bytes
    shape: tuple[int, ...]
    size: int  # elements
    offset: int  # in the blob, after its header (-1: stored by digest)
    nbytes: int
    digest: str | None = None  # of an array stored by digest, else None


def row_seed(row_id: str) -> int:
    """Where a row's blob checksum starts: the CRC-32 of the row's id (UTF-8)."""
    return crc32(row_id.encode("utf-8", "surrogatepass"))


def blob_checksum(blob: bytes | memoryview, row_id: str) -> int | None:
    """The checksum ``blob`` (with its header) should carry as ``row_id``'s blob, by its
    magic; None for a blob that starts with neither magic."""
    head = bytes(blob[:4])
    rest = memoryview(blob)[HEADER_SIZE:]
    if head == MAGIC:
        return crc32(rest, row_seed(row_id))
    if head == LEGACY_MAGIC:
        return crc32(rest)
    return None


def intact(blob: object, row_id: str) -> TypeGuard[bytes]:
    """Whether ``blob`` is bytes with a magic and the checksum it should carry as
    ``row_id``'s blob: the common case, checked with as little work as possible (anything
    else goes through the decoder's ``check_blob``, which says what is wrong)."""
    return (
        type(blob) is bytes
        and len(blob) >= HEADER_SIZE
        and blob_checksum(blob, row_id) == CRC.unpack_from(blob, 4)[0]
    )


def tensor_as_numpy(value: Any, torch: Any) -> np.ndarray[Any, Any]:
    """A C-contiguous little-endian CPU array holding the bits of a supported tensor.

    Tensors whose dtype numpy lacks (bfloat16, float8) are viewed as a same-size integer.
    """
    np_dtype, view_as = TORCH_DTYPES[str(value.dtype).removeprefix("torch.")]
    tensor = value.detach().cpu().resolve_conj().resolve_neg().contiguous()
    if view_as is not None:
        tensor = tensor.view(getattr(torch, view_as))
    return np.ascontiguousarray(tensor.numpy(), dtype=NUMPY_DTYPES[np_dtype])
