"""Decoding: a stored document and its blob become the payload again.

Arrays and tensors of one row share one writable copy of its blob (a read-only view when a
caller that copies anyway asks for it). A damaged blob or a malformed placeholder raises
CodecError naming the row. Dtypes come only from the tables of
:mod:`expstore.codec.format`; nothing is ever unpickled.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._optional import require
from ..errors import CodecError, CorruptRowError
from .checks import join
from .compression import Unpacked, unpack_array
from .format import (
    CRC,
    DAMAGED,
    ESCAPED_KEY,
    EXTERNAL_FIELDS,
    EXTERNAL_KINDS,
    FLOAT_KEY,
    HEADER_SIZE,
    MAGIC,
    MALFORMED,
    NUMPY_DTYPES,
    RESERVED_KEYS,
    TENSOR_FIELDS,
    TENSOR_KINDS,
    TORCH_DTYPES,
    TensorSpec,
    blob_checksum,
    intact,
    tagged_value,
)

__all__ = ["Arrays", "PartDecoder", "decode_payload", "plain_document"]

#: The stored bytes of arrays stored by digest, by digest (what a read fetched for its rows).
Arrays = Mapping[str, Any]
_HEX = frozenset("0123456789abcdef")


class _Fallback(Exception):
    """A fast walk met something for the full walk to handle or explain."""


class _Decoder:
    """Rebuilds values from one document and one writable copy of its blob."""

    __slots__ = ("arrays", "buf", "row_id")

    def __init__(
        self,
        blob: bytes | bytearray | memoryview | None,
        row_id: str,
        arrays: Arrays | None = None,
    ) -> None:
        self.row_id = row_id
        self.arrays = arrays
        self.buf: bytearray | None = None
        if blob is None:
            return
        if intact(blob, row_id):
            self.buf = bytearray(memoryview(blob)[HEADER_SIZE:])
            return
        self.buf = self.check_blob(memoryview(blob))

    def damaged(self, message: str) -> CodecError:
        return CorruptRowError(f"row {self.row_id}: {message}; {DAMAGED}")

    def malformed(self, path: str, message: str) -> CodecError:
        return CodecError(f"row {self.row_id}: {message} at {path or 'payload'}; {MALFORMED}")

    def check_blob(self, view: memoryview) -> bytearray:
        view = view.cast("B")
        if len(view) < HEADER_SIZE:
            raise self.damaged(f"the blob is {len(view)} bytes, shorter than its header")
        actual = blob_checksum(view, self.row_id)
        if actual is None:
            raise self.damaged(f"the blob starts with {bytes(view[:4])!r}, expected {MAGIC!r}")
        (expected,) = CRC.unpack(view[4:HEADER_SIZE])
        rest = view[HEADER_SIZE:]
        if actual != expected:
            raise self.damaged(
                "the blob's checksum does not match its contents and this row (a damaged "
                "blob, or one copied from another row)"
            )
        # The one copy per row: arrays view into it, so they are writable.
        return bytearray(rest)

    def decode(self, value: Any, path: str) -> Any:
        kind = type(value)
        if kind is dict:
            if len(value) == 1:
                (key,) = value
                if key in RESERVED_KEYS:
                    return self.decode_placeholder(key, value[key], path)
            elif not RESERVED_KEYS.isdisjoint(value):
                raise self.malformed(path, f"a placeholder with extra keys {sorted(value)}")
            return {k: self.decode(v, join(path, k)) for k, v in value.items()}
        if kind is list:
            return [self.decode(v, f"{path}[{i}]") for i, v in enumerate(value)]
        return value

    def decode_fast(self, value: Any) -> Any:
        """decode() without paths, rebuilding containers in place (the document is ours,
        fresh from the database driver). Raises _Fallback on anything unusual."""
        kind = type(value)
        if kind is dict:
            if not RESERVED_KEYS.isdisjoint(value):
                if len(value) != 1:
                    raise _Fallback
                ((key, spec),) = value.items()
                return self.decode_placeholder(key, spec, "")
            for key, item in value.items():
                kind = type(item)
                if kind is dict or kind is list:
                    value[key] = self.decode_fast(item)
            return value
        if kind is list:
            for i, item in enumerate(value):
                kind = type(item)
                if kind is dict or kind is list:
                    value[i] = self.decode_fast(item)
            return value
        return value

    def decode_placeholder(self, key: str, spec: Any, path: str) -> Any:
        if key == FLOAT_KEY:
            value = tagged_value(spec)
            if value is None:
                raise self.malformed(path, f"a float placeholder holding {spec!r}")
            return value
        if key == ESCAPED_KEY:
            if type(spec) is not dict:
                raise self.malformed(path, f"an escaped dict holding {type(spec).__name__}")
            return {k: self.decode(v, join(path, k)) for k, v in spec.items()}
        return self.decode_tensor(spec, path)

    def decode_tensor(self, spec: Any, path: str) -> Any:
        return self.tensor_at(self.tensor_spec(spec, path), path)

    def tensor_spec(self, spec: Any, path: str) -> TensorSpec:
        """A placeholder's spec, checked: everything about it that does not need the blob
        (or, for an array stored by digest, its stored bytes)."""
        digest = None
        if type(spec) is dict and spec.keys() == EXTERNAL_FIELDS:
            digest = spec["digest"]
            if (
                spec["kind"] not in EXTERNAL_KINDS
                or type(digest) is not str
                or len(digest) != 32
                or not _HEX.issuperset(digest)
            ):
                raise self.malformed(path, f"a tensor placeholder holding {spec!r}")
            offset, nbytes = -1, None
        elif type(spec) is not dict or spec.keys() != TENSOR_FIELDS:
            raise self.malformed(path, f"a tensor placeholder holding {spec!r}")
        else:
            offset, nbytes = spec["offset"], spec["nbytes"]
            if type(offset) is not int or type(nbytes) is not int or offset < 0 or nbytes < 0:
                raise self.malformed(path, f"a tensor placeholder holding {spec!r}")
        kind, dtype_name, shape = spec["kind"], spec["dtype"], spec["shape"]
        if kind not in TENSOR_KINDS:
            raise self.malformed(path, f"a tensor placeholder of unknown kind {kind!r}")
        if type(shape) is not list or not all(type(n) is int and n >= 0 for n in shape):
            raise self.malformed(path, f"a tensor placeholder holding {spec!r}")
        if kind == "torch":
            if dtype_name not in TORCH_DTYPES:
                raise self.damaged(f"{path} names torch dtype {dtype_name!r}, not a known dtype")
            np_dtype = NUMPY_DTYPES[TORCH_DTYPES[dtype_name][0]]
        else:
            if dtype_name not in NUMPY_DTYPES:
                raise self.damaged(f"{path} names dtype {dtype_name!r}, not a numeric dtype")
            np_dtype = NUMPY_DTYPES[dtype_name]
        if (kind == "npscalar" and shape) or (
            kind == "bytes" and (len(shape) != 1 or dtype_name != "|u1")
        ):
            raise self.malformed(path, f"a {kind} placeholder with shape {shape}")
        count = math.prod(shape)
        size = count * np_dtype.itemsize
        if nbytes is None:
            nbytes = size
        elif size != nbytes:
            raise self.damaged(
                f"{path} has shape {shape} of {dtype_name} ({size} bytes) "
                f"but records {nbytes} bytes"
            )
        return TensorSpec(kind, dtype_name, np_dtype, tuple(shape), count, offset, nbytes, digest)

    def tensor_at(self, spec: TensorSpec, path: str) -> Any:
        """The array, tensor or bytes a checked spec names in this row's blob (or, stored by
        digest, among the arrays the read fetched)."""
        kind, dtype_name, np_dtype, shape, size, offset, nbytes, digest = spec
        if digest is not None:
            stored = None if self.arrays is None else self.arrays.get(digest)
            if stored is None:
                raise CorruptRowError(
                    f"row {self.row_id}: {path} refers to the array {digest}, which is not "
                    f"stored; {DAMAGED}"
                )
            if type(stored) is Unpacked:
                array = stored.array[...]  # a view: the caller tells rows that share it apart
            else:
                array = unpack_array(stored, digest, np_dtype, shape, f"row {self.row_id}: {path}")
            if not np_dtype.isnative:  # only on big-endian machines
                array = array.astype(np_dtype.newbyteorder("="))
            return array if kind == "numpy" else self.to_torch(array, dtype_name, path)
        if self.buf is None:
            raise self.damaged(f"{path} refers to tensor data but the row has no blob")
        if offset + nbytes > len(self.buf):
            raise self.damaged(
                f"{path} needs bytes {offset}..{offset + nbytes} of a {len(self.buf)}-byte blob"
            )
        if kind == "bytes":
            return bytes(memoryview(self.buf)[offset : offset + nbytes])
        array = np.frombuffer(self.buf, np_dtype, size, offset)
        if len(shape) != 1:
            array = array.reshape(shape)
        if not np_dtype.isnative:  # only on big-endian machines
            array = array.astype(np_dtype.newbyteorder("="))
        if kind == "numpy":
            return array
        if kind == "npscalar":
            return array[()]
        return self.to_torch(array, dtype_name, path)

    def to_torch(self, array: np.ndarray[Any, Any], dtype_name: str, path: str) -> Any:
        torch = require("torch", "decoding a stored torch tensor")
        torch_dtype = getattr(torch, dtype_name, None)
        if torch_dtype is None:
            raise CodecError(
                f"row {self.row_id}: {path} is a torch {dtype_name} tensor, which this torch "
                f"{torch.__version__} does not support; upgrade torch"
            )
        tensor = torch.from_numpy(array)
        view_as = TORCH_DTYPES[dtype_name][1]
        return tensor.view(torch_dtype) if view_as is not None else tensor


def plain_document(text: Any, blob: Any) -> bool:
    """Whether a stored document (its JSON text and blob) holds no placeholder, so the
    text's parsed value is its payload as it is, with no walk over it: no blob, and no
    ``__`` in the text (every reserved key begins so, and the writer escapes no
    character of one: a text holding any escape ``\\u`` is walked)."""
    return blob is None and type(text) is str and "__" not in text and "\\u" not in text


def decode_payload(
    doc: dict[str, Any],
    blob: bytes | bytearray | memoryview | None,
    *,
    row_id: str,
    arrays: Arrays | None = None,
) -> dict[str, Any]:
    """Rebuild the payload :func:`encode_payload` split into ``doc`` and ``blob``.

    Arrays and tensors of one row share one writable copy of the blob. A damaged blob or a
    malformed placeholder raises CodecError naming ``row_id``. ``arrays``: the stored bytes
    of the arrays the document refers to by digest (CorruptRowError for one missing).
    """
    if type(doc) is not dict:
        raise CodecError(
            f"row {row_id}: the stored document is a {type(doc).__name__}, "
            f"not a JSON object; {MALFORMED}"
        )
    part = PartDecoder(blob, row_id, arrays)
    try:
        return {key: part.decode_part(value, key) for key, value in doc.items()}
    except RecursionError as exc:
        raise CodecError(f"row {row_id}: the stored document is nested too deeply") from exc


class PartDecoder(_Decoder):
    """Decodes parts of one row's document, checking and copying its blob once
    (``PartDecoder(blob, row_id, arrays=None)``, ``arrays`` as for :func:`decode_payload`).

    Each part goes through the fast walk (no paths, containers rebuilt in place); anything
    unusual is walked again with paths, for an error message that says where.
    """

    __slots__ = ()

    def decode_part(self, value: Any, path: str) -> Any:
        kind = type(value)
        if kind is not dict and kind is not list:
            return value
        try:
            return self.decode_fast(value)
        except (CodecError, _Fallback):
            return self.decode(value, path)
