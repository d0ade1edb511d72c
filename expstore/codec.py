"""Turn the free-form fields of an experience row into a JSON document plus one blob, and back.

A payload is a dict of fields (``state``, ``actions``, ``messages``...), each holding JSON
values, pydantic models, numpy arrays and scalars, torch tensors and bytes, nested at any
depth. :func:`encode_payload` keeps ordinary JSON data exactly as it is in the document (the
query layer runs JSON-path queries such as ``state.url`` into it) and replaces everything
JSON cannot hold with a placeholder, a dict with a single reserved key::

    {"__tensor__": {"kind": "numpy", "dtype": "<f4", "shape": [2, 3], "offset": 0, "nbytes": 24}}
    {"__float__": "nan"}                      # also "inf" and "-inf"
    {"__escaped__": {"__float__": 1}}         # a user dict that happens to use a reserved key

Tensor bytes go into one blob: ``b"XST1"``, the little-endian crc32 of the rest, then every
tensor's bytes, each starting at a multiple of 8 from the end of that 8-byte header.

Nothing is ever pickled: dtypes come from a whitelist, and decoding is ``np.frombuffer`` over
one writable copy of the blob. Importing this module does not import torch; a value can only
be a torch tensor if something else already imported torch, and decoding a stored torch
tensor imports it on demand.

>>> import numpy as np
>>> doc, blob = encode_payload({"state": {"url": "a", "obs": np.zeros(2, np.float32)}})
>>> doc["state"]["url"], doc["state"]["obs"]["__tensor__"]["dtype"]
('a', '<f4')
>>> decode_payload(doc, blob, row_id="r1")["state"]["obs"]
array([0., 0.], dtype=float32)
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Callable, Sequence
from typing import Any, TypeGuard

import numpy as np
from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_jsonable_python

from ._optional import loaded_torch, require
from .errors import CodecError

try:  # ISA-L's CRC-32: the same checksum as zlib's, three to four times faster
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency; zlib gives the same values
    from zlib import crc32

__all__ = [
    "check_value",
    "text_problem",
    "decode_payload",
    "PartDecoder",
    "PayloadWriter",
    "decode_texts",
    "deep_equal",
    "dump_document",
    "encode_payload",
    "to_plain",
]

MAGIC = b"XST1"
HEADER_SIZE = 8
_CRC = struct.Struct("<I")  # the header's checksum field
ALIGNMENT = 8

TENSOR_KEY = "__tensor__"
FLOAT_KEY = "__float__"
ESCAPED_KEY = "__escaped__"
RESERVED_KEYS = frozenset({TENSOR_KEY, FLOAT_KEY, ESCAPED_KEY})

_TENSOR_FIELDS = frozenset({"kind", "dtype", "shape", "offset", "nbytes"})
_TENSOR_KINDS = frozenset({"numpy", "npscalar", "torch", "bytes"})

# numpy dtypes are stored as little-endian dtype strings and read back only through this
# table, so a stored document can never name an object, string or structured dtype.
# longdouble is platform-dependent ('<f16' on x86-64 Linux, '<f8' on Windows).
_NUMPY_TYPES = (
    np.bool_,
    np.int8, np.int16, np.int32, np.int64,
    np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64, np.longdouble,
    np.complex64, np.complex128, np.clongdouble,
)  # fmt: skip
_NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    np.dtype(t).newbyteorder("<").str: np.dtype(t).newbyteorder("<") for t in _NUMPY_TYPES
}
_NUMERIC_KINDS = frozenset("biufc")
_PADDING = [bytes(n) for n in range(ALIGNMENT)]
# The stored (little-endian) dtype of each storable dtype already in that byte order: the
# common case skips the checks in _numpy_problem.
_STORED_DTYPE: dict[np.dtype[Any], np.dtype[Any]] = {
    d: d for d in _NUMPY_DTYPES.values() if d.byteorder in "<|=" or d.itemsize == 1
}
_FAST_DTYPE_NAMES: dict[np.dtype[Any], str] = {d: d.str for d in _STORED_DTYPE}

# torch dtype name -> (numpy dtype of the stored bytes, torch dtype to view those bytes as
# when numpy has no equivalent). Only names in this table are ever looked up on torch.
_TORCH_DTYPES: dict[str, tuple[str, str | None]] = {
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

_ACCEPTED = (
    "accepted types are None, bool, int, float, str, bytes, list, tuple, dict with str keys, "
    "pydantic models, numpy arrays and scalars of bool/int/uint/float/complex dtype, "
    "and torch tensors"
)

_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}

_DAMAGED = "the stored tensor data is damaged or truncated; delete and re-store the row"
_MALFORMED = "the stored document is damaged; delete and re-store the row"


# ---------------------------------------------------------------------------------------
# Shared checks


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _numpy_problem(dtype: np.dtype[Any]) -> str | None:
    """Why an array of ``dtype`` cannot be stored, or None if it can."""
    if dtype.kind in _NUMERIC_KINDS:
        if dtype.newbyteorder("<").str in _NUMPY_DTYPES:
            return None
        return f"numpy dtype {dtype} is not supported"
    if dtype.kind == "O":
        return "object arrays would need pickle; convert to a numeric dtype or a list"
    if dtype.kind in "US":
        return "string arrays are not stored as tensors; convert to a list with .tolist()"
    if dtype.kind in "Mm":
        return "datetime arrays are not supported; convert with .astype('int64') or .tolist()"
    if dtype.kind == "V":
        return "structured arrays are not supported; store each field as its own array"
    return f"numpy dtype {dtype} is not supported; convert to a numeric dtype or a list"


def _torch_problem(tensor: Any, torch: Any) -> str | None:
    """Why ``tensor`` cannot be stored, or None if it can."""
    if tensor.layout != torch.strided:
        return f"{tensor.layout} tensors are not supported; convert with .to_dense()"
    if tensor.is_quantized:
        return "quantized tensors are not supported; convert with .dequantize()"
    if getattr(tensor, "is_nested", False):
        return "nested tensors are not supported; store a list of tensors"
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in _TORCH_DTYPES:
        supported = ", ".join(sorted(_TORCH_DTYPES))
        return f"torch dtype {name} is not supported; supported dtypes are {supported}"
    return None


def _unsupported(value: Any) -> str:
    kind = type(value)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    hint = ""
    if isinstance(value, (set, frozenset)):
        hint = "; convert the set to a (sorted) list"
    elif isinstance(value, complex):
        hint = "; wrap it as np.complex128(...) or store real and imaginary parts"
    return f"cannot store a value of type {name}; {_ACCEPTED}{hint}"


# ---------------------------------------------------------------------------------------
# Encoding


class _Encoder:
    """Walks one payload, collecting tensor bytes and building the JSON document."""

    __slots__ = ("chunks", "size", "tensors")

    def __init__(self) -> None:
        self.chunks: list[Any] = []
        self.size = 0
        self.tensors = 0

    def fail(self, path: str, message: str) -> CodecError:
        return CodecError(f"{path or 'payload'}: {message}")

    def placeholder(self, kind: str, dtype: str, shape: tuple[int, ...], data: Any) -> Any:
        """Append a C-contiguous array's bytes at an aligned offset; its placeholder."""
        size = self.size
        offset = -(-size // ALIGNMENT) * ALIGNMENT
        if offset > size:
            self.chunks.append(_PADDING[offset - size])
        # A C-contiguous array exports its bytes as is (0-d arrays included).
        self.chunks.append(data)
        nbytes = data.nbytes
        self.size = offset + nbytes
        self.tensors += 1
        return {
            TENSOR_KEY: {
                "kind": kind,
                "dtype": dtype,
                "shape": list(shape),
                "offset": offset,
                "nbytes": nbytes,
            }
        }

    def encode(self, value: Any, path: str, lenient: bool = False) -> Any:
        """The JSON form of ``value``; ``lenient`` is set inside pydantic dumps.

        The hot path builds no path strings: a failure deep inside raises _Failure, which
        collects the path segments as it unwinds (see encode_payload).
        """
        kind = type(value)
        if value is None or kind is bool or kind is int or kind is str:
            return value
        if kind is float:
            return value if math.isfinite(value) else {FLOAT_KEY: repr(value)}
        if kind is dict:
            return self.encode_dict(value, lenient)
        if kind is list or kind is tuple:
            return self.encode_list(value, lenient)
        if isinstance(value, np.ndarray):
            return self.encode_numpy(value, path)
        if isinstance(value, np.generic):
            return self.encode_numpy_scalar(value, path, lenient)
        torch = loaded_torch()
        if torch is not None and isinstance(value, torch.Tensor):
            return self.encode_torch(value, path, torch)
        if isinstance(value, BaseModel):
            return self.encode(value.model_dump(mode="python"), path, lenient=True)
        # Subclasses (IntEnum, StrEnum, OrderedDict, namedtuple...) are stored as their base.
        if isinstance(value, bool):
            return bool(value)
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return self.encode(float(value), path)
        if isinstance(value, str):
            return str.__str__(value)
        if isinstance(value, (bytes, bytearray)):
            data = np.frombuffer(value, np.uint8)
            return self.placeholder("bytes", "|u1", data.shape, data)
        if isinstance(value, dict):
            return self.encode_dict(value, lenient)
        if isinstance(value, (list, tuple)):
            return self.encode_list(value, lenient)
        if lenient:
            # Inside a pydantic dump, datetimes, UUIDs, enums, sets... take their JSON form.
            try:
                plain = to_jsonable_python(value)
            except PydanticSerializationError as exc:
                raise self.fail(path, _unsupported(value)) from exc
            return self.encode(plain, path)
        raise self.fail(path, _unsupported(value))

    def encode_list(self, value: list[Any] | tuple[Any, ...], lenient: bool) -> list[Any]:
        out: list[Any] = []
        encode = self.encode
        append = out.append
        for i, item in enumerate(value):
            kind = type(item)
            # Plain JSON scalars are most of the data: keep them off the call path.
            if kind is str or kind is int or kind is bool or item is None:
                append(item)
                continue
            try:
                append(encode(item, "", lenient))
            except _Failure as failure:
                failure.segments.append(f"[{i}]")
                raise
            except CodecError as exc:
                raise _Failure(exc, f"[{i}]") from exc
        return out

    def encode_dict(self, value: dict[Any, Any], lenient: bool) -> dict[str, Any]:
        out: dict[str, Any] = {}
        encode = self.encode
        for key, item in value.items():
            if type(key) is not str:
                if isinstance(key, str):
                    key = str.__str__(key)
                elif lenient:
                    key = self.jsonable_key(key, "")
                else:
                    raise self.fail(
                        "",
                        f"dict keys must be str, got key {key!r} of type {type(key).__name__}; "
                        "convert the keys to str",
                    )
            kind = type(item)
            if kind is str or kind is int or kind is bool or item is None:
                out[key] = item
                continue
            try:
                out[key] = encode(item, "", lenient)
            except _Failure as failure:
                failure.segments.append(f".{key}")
                raise
            except CodecError as exc:
                raise _Failure(exc, f".{key}") from exc
        if not RESERVED_KEYS.isdisjoint(out):
            return {ESCAPED_KEY: out}
        return out

    def jsonable_key(self, key: Any, path: str) -> str:
        """The str a pydantic JSON dump would use for a non-str dict key (1 -> "1")."""
        try:
            (plain,) = to_jsonable_python({key: None})
        except (PydanticSerializationError, TypeError, ValueError) as exc:
            raise self.fail(path, f"cannot use {key!r} as a dict key; use str keys") from exc
        return str(plain)

    def encode_numpy(self, value: np.ndarray[Any, Any], path: str) -> Any:
        if type(value) is not np.ndarray and isinstance(value, np.ma.MaskedArray):
            raise self.fail(path, "masked arrays are not supported; store data and mask apart")
        little = _STORED_DTYPE.get(value.dtype)
        if little is None:
            problem = _numpy_problem(value.dtype)
            if problem:
                raise self.fail(path, f"{problem} (got dtype {value.dtype})")
            little = value.dtype.newbyteorder("<")
        exact = type(value) is np.ndarray and value.flags.c_contiguous
        data = value if exact else np.ascontiguousarray(value)
        if data.dtype != little or data.dtype.byteorder == ">":
            data = np.ascontiguousarray(data, dtype=little)
        return self.placeholder("numpy", little.str, value.shape, data)

    def encode_numpy_scalar(self, value: np.generic, path: str, lenient: bool) -> Any:
        dtype = value.dtype
        if dtype.kind in _NUMERIC_KINDS and _numpy_problem(dtype) is None:
            little = dtype.newbyteorder("<")
            data = np.ascontiguousarray(np.asarray(value), dtype=little)
            return self.placeholder("npscalar", little.str, (), data)
        if isinstance(value, str):  # np.str_
            return str.__str__(value)
        if isinstance(value, bytes):  # np.bytes_
            data = np.frombuffer(value, np.uint8)
            return self.placeholder("bytes", "|u1", data.shape, data)
        raise self.fail(path, f"{_numpy_problem(dtype)} (got numpy scalar {value!r})")

    def encode_torch(self, value: Any, path: str, torch: Any) -> Any:
        problem = _torch_problem(value, torch)
        if problem:
            raise self.fail(path, problem)
        try:
            data = _tensor_as_numpy(value, torch)
        except (RuntimeError, TypeError, NotImplementedError) as exc:
            raise self.fail(path, f"cannot copy the tensor to CPU memory: {exc}") from exc
        name = str(value.dtype).removeprefix("torch.")
        return self.placeholder("torch", name, tuple(value.shape), data)

    def blob(self) -> bytes | None:
        chunks = self.chunks
        if not chunks:
            return None
        if len(chunks) == 1:  # one tensor, no padding: the common case
            (chunk,) = chunks
            return b"".join((MAGIC, _CRC.pack(crc32(chunk)), chunk))
        crc = 0
        for chunk in chunks:
            crc = crc32(chunk, crc)
        return b"".join([MAGIC, _CRC.pack(crc), *chunks])


class _Failure(Exception):
    """A CodecError raised below a container, collecting its path while it unwinds."""

    def __init__(self, error: CodecError, segment: str) -> None:
        super().__init__(str(error))
        self.error = error
        self.segments = [segment]

    def as_error(self, field: str) -> CodecError:
        # The inner error's message is "payload: <what is wrong>"; put the full path first.
        message = str(self.error).split(": ", 1)[-1]
        path = field + "".join(reversed(self.segments))
        return CodecError(f"{path}: {message}")


def encode_payload(payload: dict[str, Any]) -> tuple[dict[str, Any], bytes | None]:
    """Split ``payload`` into a JSON-able document and one blob of tensor bytes.

    The blob is None when the payload holds no arrays, tensors or bytes. Top-level keys are
    field names and are kept as they are; below them, reserved keys are escaped. Raises
    CodecError naming the path (``state.obs[2]``) of the first value that cannot be stored.
    """
    encoder = _Encoder()
    doc: dict[str, Any] = {}
    try:
        for key, value in payload.items():
            if not isinstance(key, str):
                raise CodecError(f"payload field names must be str, got {key!r}")
            try:
                doc[str.__str__(key)] = encoder.encode(value, key)
            except _Failure as failure:
                raise failure.as_error(key) from failure.error
    except RecursionError as exc:
        raise CodecError(
            "payload is nested too deeply or contains itself; store a flatter structure"
        ) from exc
    return doc, encoder.blob()


def dump_document(doc: dict[str, Any]) -> str:
    """The compact JSON text a document is stored as."""
    return json.dumps(doc, allow_nan=False, separators=(",", ":"), ensure_ascii=False)


class PayloadWriter:
    """Encodes many payloads to (JSON text, blob), as ``encode_payload`` plus
    :func:`dump_document` would, faster.

    The json module's C encoder walks the plain data and calls back only for arrays,
    tensors, bytes and pydantic models. Whatever it cannot settle alone (non-finite floats,
    keys or strings starting with "__" that may need escaping, unsupported values) goes
    through the full walk, so the result and every error are the same.
    """

    def __init__(self) -> None:
        self._encoder = _Encoder()
        self._json: Callable[[Any], str] = json.JSONEncoder(
            allow_nan=False,
            separators=(",", ":"),
            ensure_ascii=False,
            check_circular=False,
            default=self._default,
        ).encode
        make = getattr(json.encoder, "c_make_encoder", None)
        if make is not None:
            # What JSONEncoder.encode builds on every call, built once: the C encoder with
            # the same settings (no circular check, compact separators, no NaN).
            chunks = make(
                None, self._default, json.encoder.encode_basestring, None, ":", ",",
                False, False, False,
            )  # fmt: skip
            self._json = lambda value: "".join(chunks(value, 0))

    def _default(self, value: Any) -> Any:
        encoder = self._encoder
        if isinstance(value, np.ndarray):
            stored = _FAST_DTYPE_NAMES.get(value.dtype)
            if stored is not None and type(value) is np.ndarray and value.flags.c_contiguous:
                return encoder.placeholder("numpy", stored, value.shape, value)
            return encoder.encode_numpy(value, "")
        torch = loaded_torch()
        if torch is not None and isinstance(value, torch.Tensor):
            return encoder.encode_torch(value, "", torch)
        if isinstance(value, (np.generic, bytes, bytearray, BaseModel)):
            return encoder.encode(value, "")
        raise _Fallback

    def encode(self, payload: dict[str, Any]) -> tuple[str, bytes | None]:
        """``(document as JSON text, blob)`` for one payload; raises like encode_payload."""
        self._encoder = encoder = _Encoder()
        try:
            text = self._json(payload)
        except (_Fallback, ValueError, TypeError, CodecError, RecursionError):
            pass
        else:
            # Each placeholder the encoder emitted holds '"__' exactly once; any other
            # occurrence is user data (a key or string starting with "__") that the full
            # walk may need to escape.
            if text.count('"__') == encoder.tensors:
                return text, encoder.blob()
        doc, blob = encode_payload(payload)
        return dump_document(doc), blob


# ---------------------------------------------------------------------------------------
# Decoding


class _Fallback(Exception):
    """A fast walk met something for the full walk to handle or explain."""


def _intact(blob: object) -> TypeGuard[bytes]:
    """Whether ``blob`` is bytes with the magic and a matching checksum: the common case,
    checked with as little work as possible (anything else goes through
    ``_Decoder.check_blob``, which says what is wrong)."""
    return (
        type(blob) is bytes
        and len(blob) >= HEADER_SIZE
        and blob.startswith(MAGIC)
        and crc32(memoryview(blob)[HEADER_SIZE:]) == _CRC.unpack_from(blob, 4)[0]
    )


class _Decoder:
    """Rebuilds values from one document and one writable copy of its blob."""

    __slots__ = ("row_id", "buf")

    def __init__(self, blob: bytes | bytearray | memoryview | None, row_id: str) -> None:
        self.row_id = row_id
        self.buf: bytearray | None = None
        if blob is None:
            return
        if _intact(blob):
            self.buf = bytearray(memoryview(blob)[HEADER_SIZE:])
            return
        self.buf = self.check_blob(memoryview(blob))

    def damaged(self, message: str) -> CodecError:
        return CodecError(f"row {self.row_id}: {message}; {_DAMAGED}")

    def malformed(self, path: str, message: str) -> CodecError:
        return CodecError(f"row {self.row_id}: {message} at {path or 'payload'}; {_MALFORMED}")

    def check_blob(self, view: memoryview) -> bytearray:
        view = view.cast("B")
        if len(view) < HEADER_SIZE:
            raise self.damaged(f"the blob is {len(view)} bytes, shorter than its header")
        if view[:4] != MAGIC:
            raise self.damaged(f"the blob starts with {bytes(view[:4])!r}, expected {MAGIC!r}")
        (expected,) = _CRC.unpack(view[4:HEADER_SIZE])
        rest = view[HEADER_SIZE:]
        if crc32(rest) != expected:
            raise self.damaged("the blob's checksum does not match its contents")
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
            return {k: self.decode(v, _join(path, k)) for k, v in value.items()}
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
            if not isinstance(spec, str) or spec not in _NON_FINITE:
                raise self.malformed(path, f"a float placeholder holding {spec!r}")
            return _NON_FINITE[spec]
        if key == ESCAPED_KEY:
            if type(spec) is not dict:
                raise self.malformed(path, f"an escaped dict holding {type(spec).__name__}")
            return {k: self.decode(v, _join(path, k)) for k, v in spec.items()}
        return self.decode_tensor(spec, path)

    def decode_tensor(self, spec: Any, path: str) -> Any:
        return self.tensor_at(self.tensor_spec(spec, path), path)

    def tensor_spec(self, spec: Any, path: str) -> _TensorSpec:
        """A placeholder's spec, checked: everything about it that does not need the blob."""
        if type(spec) is not dict or spec.keys() != _TENSOR_FIELDS:
            raise self.malformed(path, f"a tensor placeholder holding {spec!r}")
        kind, dtype_name = spec["kind"], spec["dtype"]
        shape, offset, nbytes = spec["shape"], spec["offset"], spec["nbytes"]
        if kind not in _TENSOR_KINDS:
            raise self.malformed(path, f"a tensor placeholder of unknown kind {kind!r}")
        if (
            type(shape) is not list
            or not all(type(n) is int and n >= 0 for n in shape)
            or type(offset) is not int
            or type(nbytes) is not int
            or offset < 0
            or nbytes < 0
        ):
            raise self.malformed(path, f"a tensor placeholder holding {spec!r}")
        if kind == "torch":
            if dtype_name not in _TORCH_DTYPES:
                raise self.damaged(f"{path} names torch dtype {dtype_name!r}, not a known dtype")
            np_dtype = _NUMPY_DTYPES[_TORCH_DTYPES[dtype_name][0]]
        else:
            if dtype_name not in _NUMPY_DTYPES:
                raise self.damaged(f"{path} names dtype {dtype_name!r}, not a numeric dtype")
            np_dtype = _NUMPY_DTYPES[dtype_name]
        if (kind == "npscalar" and shape) or (
            kind == "bytes" and (len(shape) != 1 or dtype_name != "|u1")
        ):
            raise self.malformed(path, f"a {kind} placeholder with shape {shape}")
        count = math.prod(shape)
        if count * np_dtype.itemsize != nbytes:
            raise self.damaged(
                f"{path} has shape {shape} of {dtype_name} ({count * np_dtype.itemsize} bytes) "
                f"but records {nbytes} bytes"
            )
        return kind, dtype_name, np_dtype, tuple(shape), count, offset, nbytes

    def tensor_at(self, spec: _TensorSpec, path: str) -> Any:
        """The array, tensor or bytes a checked spec names in this row's blob."""
        kind, dtype_name, np_dtype, shape, count, offset, nbytes = spec
        if self.buf is None:
            raise self.damaged(f"{path} refers to tensor data but the row has no blob")
        if offset + nbytes > len(self.buf):
            raise self.damaged(
                f"{path} needs bytes {offset}..{offset + nbytes} of a {len(self.buf)}-byte blob"
            )
        if kind == "bytes":
            return bytes(memoryview(self.buf)[offset : offset + nbytes])
        array = np.frombuffer(self.buf, np_dtype, count, offset)
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
        view_as = _TORCH_DTYPES[dtype_name][1]
        return tensor.view(torch_dtype) if view_as is not None else tensor


def decode_payload(
    doc: dict[str, Any], blob: bytes | bytearray | memoryview | None, *, row_id: str
) -> dict[str, Any]:
    """Rebuild the payload :func:`encode_payload` split into ``doc`` and ``blob``.

    Arrays and tensors of one row share one writable copy of the blob. A damaged blob or a
    malformed placeholder raises CodecError naming ``row_id``.
    """
    if type(doc) is not dict:
        raise CodecError(
            f"row {row_id}: the stored document is a {type(doc).__name__}, "
            f"not a JSON object; {_MALFORMED}"
        )
    part = PartDecoder(blob, row_id)
    try:
        return {key: part.decode_part(value, key) for key, value in doc.items()}
    except RecursionError as exc:
        raise CodecError(f"row {row_id}: the stored document is nested too deeply") from exc


class PartDecoder(_Decoder):
    """Decodes parts of one row's document, checking and copying its blob once.

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

    def decode_text(self, text: str, path: str) -> Any:
        """:meth:`decode_part` of a part given as JSON text (as the database extracted it).

        A tensor placeholder's text is the same in every row that stores a tensor of that
        dtype and shape at that place, so its checked spec is kept: most rows of a batch
        cost a dict lookup and ``np.frombuffer``.
        """
        spec = _KNOWN_SPECS.get(text)
        if spec is not None:
            return self.tensor_at(spec, path)
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise self.malformed(path, f"text that is not JSON ({exc})") from exc
        if type(value) is dict and len(value) == 1 and TENSOR_KEY in value:
            spec = self.tensor_spec(value[TENSOR_KEY], path)
            _remember(text, spec)
            return self.tensor_at(spec, path)
        return self.decode_part(value, path)


def decode_texts(
    texts: Sequence[str | None],
    blobs: Sequence[bytes | bytearray | memoryview | None],
    row_ids: Sequence[str],
    path: str,
    *,
    writable: bool = True,
    checked: set[int] | None = None,
    stack: bool = False,
) -> list[Any] | np.ndarray:
    """One part of many rows, each given as JSON text (as the database extracted it) beside
    its row's blob and id: ``PartDecoder(blob, row_id).decode_text(text, path)`` for each
    row, and None where a text is None (SQL NULL).

    With ``stack=True``, when every row holds a numpy array of one dtype and shape (of at
    least one dimension) there, as a tensor field does, the result is instead one
    read-only array whose first axis runs over the rows, a view of the rows' blobs joined
    (see :func:`_stacked`); otherwise the list.

    A tensor placeholder's text is the same in every row that stores a tensor of that dtype
    and shape at that place, so its checked spec is kept by its text: for most rows a numpy
    array costs a dict lookup, the blob's checksum and ``np.frombuffer`` over a copy of its
    own bytes, or with ``writable=False`` over the blob itself (a read-only array, for a
    caller that copies it anyway, such as a converter stacking a batch). ``checked`` holds
    the ``id()`` of blobs already verified, so that several parts of one row check its
    blob once; its blobs must stay alive while it is in use.
    """
    if stack and texts and texts[0] is not None:
        if texts[0] not in _KNOWN_VIEWS:  # learn the placeholder from the first row
            PartDecoder(blobs[0], row_ids[0]).decode_text(texts[0], path)
        stacked = _stacked(texts, blobs, checked)
        if stacked is not None:
            return stacked
    views = _KNOWN_VIEWS
    frombuffer = np.frombuffer
    out: list[Any] = []
    append = out.append
    for text, blob, row_id in zip(texts, blobs, row_ids, strict=True):
        view = views.get(text)  # type: ignore[arg-type]  # None is never a key
        if view is not None and type(blob) is bytes and len(blob) >= view[3]:
            if (checked is not None and id(blob) in checked) or _intact(blob):
                dtype, count, start, end, shape = view
                if writable:
                    array = frombuffer(bytearray(memoryview(blob)[start:end]), dtype, count)
                else:
                    array = frombuffer(blob, dtype, count, start)
                append(array if shape is None else array.reshape(shape))
                if checked is not None:
                    checked.add(id(blob))
                continue
        append(None if text is None else PartDecoder(blob, row_id).decode_text(text, path))
    return out


def _stacked(
    texts: Sequence[str | None],
    blobs: Sequence[bytes | bytearray | memoryview | None],
    checked: set[int] | None,
) -> np.ndarray | None:
    """The arrays of a batch of rows as one read-only ``(rows, *shape)`` array, when every
    row has the same known placeholder text and blobs of one length, all intact; else None
    (the caller decodes row by row, which explains any damage).

    The blobs are joined into one buffer and viewed with a row stride, so there is no
    per-row array: the cost beyond the join is each blob's checksum.
    """
    first = texts[0]
    view = _KNOWN_VIEWS.get(first)  # type: ignore[arg-type]  # None is never a key
    if view is None or view[4] == () or texts.count(first) != len(texts):
        return None
    dtype, count, start, end, shape = view
    size = len(blobs[0]) if type(blobs[0]) is bytes else 0
    if size < end or set(map(type, blobs)) != {bytes} or set(map(len, blobs)) != {size}:  # type: ignore[arg-type]
        return None
    joined = b"".join(blobs)  # type: ignore[arg-type]
    table = np.frombuffer(joined, np.uint8).reshape(len(blobs), size)
    if checked is None or not all(id(b) in checked for b in blobs):
        if not (table[:, :4] == _MAGIC_BYTES).all():
            return None
        whole = memoryview(joined)
        sums = np.fromiter(
            (crc32(whole[at + HEADER_SIZE : at + size]) for at in range(0, len(joined), size)),
            np.uint32,
            len(blobs),
        )
        if not np.array_equal(sums, table[:, 4:HEADER_SIZE].copy().view(_CRC_DTYPE).ravel()):
            return None
        if checked is not None:
            checked.update(map(id, blobs))
    arrays = table[:, start:end].view(dtype)
    return arrays if shape is None else arrays.reshape(len(blobs), *shape)


_MAGIC_BYTES = np.frombuffer(MAGIC, np.uint8)
_CRC_DTYPE = np.dtype("<u4")  # the header's checksum field, as _CRC reads it

#: (kind, dtype name, numpy dtype, shape, element count, offset, nbytes), checked.
_TensorSpec = tuple[str, str, np.dtype[Any], tuple[int, ...], int, int, int]
#: Checked tensor specs by the JSON text of their placeholder (see decode_text).
_KNOWN_SPECS: dict[str, _TensorSpec] = {}
#: The same for numpy arrays in native byte order, as decode_texts reads them straight
#: from a blob: (dtype, element count, start and end in the blob, shape or None if 1-D).
_KNOWN_VIEWS: dict[str, tuple[np.dtype[Any], int, int, int, tuple[int, ...] | None]] = {}
_KNOWN_SPECS_MAX = 4096


def _remember(text: str, spec: _TensorSpec) -> None:
    if len(_KNOWN_SPECS) >= _KNOWN_SPECS_MAX:
        _KNOWN_SPECS.clear()
        _KNOWN_VIEWS.clear()
    _KNOWN_SPECS[text] = spec
    kind, _, np_dtype, shape, count, offset, nbytes = spec
    if kind == "numpy" and np_dtype.isnative:
        start = HEADER_SIZE + offset
        _KNOWN_VIEWS[text] = (
            np_dtype,
            count,
            start,
            start + nbytes,
            shape if len(shape) != 1 else None,
        )


# ---------------------------------------------------------------------------------------
# Validation, equality, plain conversion


def check_value(value: Any, path: str) -> None:
    """Raise ValueError if :func:`encode_payload` could not store ``value``.

    Walks containers without copying anything and checks arrays and tensors by dtype only,
    so it is cheap enough for a pydantic field validator. Pydantic models are accepted as
    they are.
    """
    try:
        _check(value, path)
    except RecursionError as exc:
        raise ValueError(f"{path}: nested too deeply or contains itself") from exc


_SURROGATE = re.compile("[\ud800-\udfff]")


def text_problem(text: str) -> str | None:
    """Why no database can store ``text`` (None when it can): a NUL, which PostgreSQL
    cannot store, or a lone surrogate, which is not Unicode text and cannot be written as
    UTF-8 (text decoded with ``errors="surrogateescape"`` holds them)."""
    if "\x00" in text:
        return "strings cannot hold NUL (\\x00), which PostgreSQL cannot store; remove it"
    surrogate = None if text.isascii() else _SURROGATE.search(text)
    if surrogate is not None:
        return (
            f"strings cannot hold lone surrogates ({surrogate[0]!r}), which are not Unicode "
            "text and no database can store; decode the text with errors='replace' or store "
            "its bytes"
        )
    return None


def _check(value: Any, path: str) -> None:
    kind = type(value)
    if kind is str:
        if "\x00" in value or not value.isascii():
            problem = text_problem(value)
            if problem:
                raise ValueError(f"{path}: {problem}")
        return
    if value is None or kind in (bool, int, float, bytes):
        return
    if kind is dict:
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(
                    f"{path}: dict keys must be str, got key {key!r} of type "
                    f"{type(key).__name__}; convert the keys to str"
                )
            problem = text_problem(key)
            if problem:
                raise ValueError(f"{path}: a dict key {key!r}: {problem}")
            _check(item, _join(path, key))
        return
    if kind is list or kind is tuple:
        for i, item in enumerate(value):
            _check(item, f"{path}[{i}]")
        return
    if isinstance(value, np.ndarray):
        problem = _numpy_problem(value.dtype)
        if isinstance(value, np.ma.MaskedArray):
            problem = "masked arrays are not supported; store data and mask apart"
        if problem:
            raise ValueError(f"{path}: {problem} (got numpy array of dtype {value.dtype})")
        return
    if isinstance(value, np.generic):
        if isinstance(value, (str, bytes)):
            return
        problem = _numpy_problem(value.dtype)
        if problem:
            raise ValueError(f"{path}: {problem} (got numpy scalar {value!r})")
        return
    torch = loaded_torch()
    if torch is not None and isinstance(value, torch.Tensor):
        problem = _torch_problem(value, torch)
        if problem:
            raise ValueError(f"{path}: {problem}")
        return
    if isinstance(value, str):
        return _check(str.__str__(value), path)
    if isinstance(value, (BaseModel, bool, int, float, bytes, bytearray)):
        return
    if isinstance(value, dict):
        return _check(dict(value), path)
    if isinstance(value, (list, tuple)):
        return _check(list(value), path)
    raise ValueError(f"{path}: {_unsupported(value)}")


def _array_bytes(value: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The little-endian bytes of an array as a flat uint8 array (a view when possible)."""
    data = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))
    return data.reshape(-1).view(np.uint8)


def _tensor_as_numpy(value: Any, torch: Any) -> np.ndarray[Any, Any]:
    """A C-contiguous little-endian CPU array holding the bits of a supported tensor.

    Tensors whose dtype numpy lacks (bfloat16, float8) are viewed as a same-size integer.
    """
    np_dtype, view_as = _TORCH_DTYPES[str(value.dtype).removeprefix("torch.")]
    tensor = value.detach().cpu().resolve_conj().resolve_neg().contiguous()
    if view_as is not None:
        tensor = tensor.view(getattr(torch, view_as))
    return np.ascontiguousarray(tensor.numpy(), dtype=_NUMPY_DTYPES[np_dtype])


def deep_equal(a: Any, b: Any) -> bool:
    """Structural equality that treats arrays and tensors as values.

    Arrays and tensors are equal when they are the same kind (numpy or torch), dtype
    (ignoring byte order) and shape and hold the same bytes, so NaN equals itself and -0.0
    differs from 0.0. Dicts, lists and tuples compare item by item, pydantic models field
    by field, NaN floats equal each other; everything else uses ``==``.
    """
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        if a.dtype.hasobject or b.dtype.hasobject:
            return (
                a.shape == b.shape
                and a.dtype == b.dtype
                and all(deep_equal(x, y) for x, y in zip(a.flat, b.flat, strict=True))
            )
        return (
            a.shape == b.shape
            and a.dtype.newbyteorder("<") == b.dtype.newbyteorder("<")
            and bool(np.array_equal(_array_bytes(a), _array_bytes(b)))
        )
    if isinstance(a, np.generic) or isinstance(b, np.generic):
        if type(a) is not type(b):
            return False
        return deep_equal(np.asarray(a), np.asarray(b))
    torch = loaded_torch()
    if torch is not None and (isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor)):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape or a.layout != b.layout:
            return False
        if _torch_problem(a, torch) or _torch_problem(b, torch):
            return bool(torch.equal(a, b))
        return bool(
            np.array_equal(
                _array_bytes(_tensor_as_numpy(a, torch)), _array_bytes(_tensor_as_numpy(b, torch))
            )
        )
    if isinstance(a, BaseModel) or isinstance(b, BaseModel):
        return (
            type(a) is type(b)
            and deep_equal(a.__dict__, b.__dict__)
            and deep_equal(a.__pydantic_extra__, b.__pydantic_extra__)
            and deep_equal(a.__pydantic_private__, b.__pydantic_private__)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(deep_equal(a[k], b[k]) for k in a)
    if (isinstance(a, list) and isinstance(b, list)) or (
        isinstance(a, tuple) and isinstance(b, tuple)
    ):
        return len(a) == len(b) and all(deep_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except (ValueError, TypeError):
        return False


def to_plain(value: Any) -> Any:
    """Replace pydantic models with their ``model_dump()`` at any depth.

    Arrays, tensors and other values are returned as they are; dicts, lists and tuples
    are rebuilt around them.
    """
    if isinstance(value, BaseModel):
        return to_plain(value.model_dump(mode="python"))
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(to_plain(v) for v in value)
    return value
