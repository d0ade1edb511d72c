"""Encoding: a payload (a dict of fields holding JSON values, pydantic models, numpy arrays
and scalars, torch tensors and bytes, nested at any depth) becomes a JSON document plus one
blob, in the format of :mod:`expstore.codec.format`.

Ordinary JSON data stays exactly as it is in the document (queries run JSON paths into it);
everything JSON cannot hold becomes a placeholder. :class:`PayloadWriter` is the fast path
that writes use; :func:`encode_payload` the full walk, which every failure is explained by.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import numpy as np
from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_jsonable_python

from .._optional import loaded_torch
from ..errors import CodecError
from .checks import (
    MAX_DEPTH,
    array_problem,
    depth_error,
    key_problem,
    numpy_problem,
    too_deep,
    torch_problem,
    unsupported,
)
from .digests import array_digest
from .format import (
    ALIGNMENT,
    CRC,
    ESCAPED_KEY,
    FAST_DTYPE_NAMES,
    FLOAT_KEY,
    LEGACY_MAGIC,
    MAGIC,
    NUMERIC_KINDS,
    PADDING,
    RESERVED_KEYS,
    STORED_DTYPE,
    TENSOR_KEY,
    crc32,
    row_seed,
    tagged_float,
    tensor_as_numpy,
)

__all__ = ["PayloadWriter", "dump_document", "encode_payload"]


class _Unsettled(Exception):
    """The C JSON encoder met something for the full walk to handle or explain."""


class _Encoder:
    """Walks one payload, collecting tensor bytes and building the JSON document."""

    __slots__ = ("chunks", "external", "max_bytes", "size", "tensors", "threshold")

    def __init__(self, threshold: int | None = None, max_bytes: int | None = None) -> None:
        self.chunks: list[Any] = []
        self.size = 0
        self.tensors = 0
        #: Arrays of at least this many bytes are stored by digest (None: none is).
        self.threshold = threshold
        #: Larger arrays are refused (None: no limit).
        self.max_bytes = max_bytes
        #: (digest, array) of each array stored by digest, in document order.
        self.external: list[tuple[str, Any]] = []

    def fail(self, path: str, message: str) -> CodecError:
        return CodecError(f"{path or 'payload'}: {message}")

    def placeholder(self, kind: str, dtype: str, shape: tuple[int, ...], data: Any) -> Any:
        """Append a C-contiguous array's bytes at an aligned offset, or note it to be stored
        by digest when it is large; its placeholder."""
        nbytes = data.nbytes
        if self.max_bytes is not None and nbytes > self.max_bytes:
            raise CodecError(
                f"payload: the array of {nbytes} bytes ({kind} {dtype} {list(shape)}) is over "
                f"the buffer's max_array_bytes ({self.max_bytes}); store a smaller array or "
                "raise the limit with buffer.set_compression(max_array_bytes=...)"
            )
        if self.threshold is not None and nbytes >= self.threshold and kind != "bytes":
            digest = array_digest(data)
            self.external.append((digest, data))
            self.tensors += 1
            return {
                TENSOR_KEY: {"kind": kind, "dtype": dtype, "shape": list(shape), "digest": digest}
            }
        size = self.size
        offset = -(-size // ALIGNMENT) * ALIGNMENT
        if offset > size:
            self.chunks.append(PADDING[offset - size])
        # A C-contiguous array exports its bytes as is (0-d arrays included).
        self.chunks.append(data)
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
            return {FLOAT_KEY: repr(value)} if tagged_float(value) else value
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
                raise self.fail(path, unsupported(value)) from exc
            return self.encode(plain, path)
        raise self.fail(path, unsupported(value))

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
                    raise self.fail("", str(key_problem(key)))
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
        little = STORED_DTYPE.get(value.dtype) if type(value) is np.ndarray else None
        if little is None:
            problem = array_problem(value)
            if problem:
                raise self.fail(path, problem)
            little = value.dtype.newbyteorder("<")
        exact = type(value) is np.ndarray and value.flags.c_contiguous
        data = value if exact else np.ascontiguousarray(value)
        if data.dtype != little or data.dtype.byteorder == ">":
            data = np.ascontiguousarray(data, dtype=little)
        return self.placeholder("numpy", little.str, value.shape, data)

    def encode_numpy_scalar(self, value: np.generic, path: str, lenient: bool) -> Any:
        dtype = value.dtype
        if dtype.kind in NUMERIC_KINDS and numpy_problem(dtype) is None:
            little = dtype.newbyteorder("<")
            data = np.ascontiguousarray(np.asarray(value), dtype=little)
            return self.placeholder("npscalar", little.str, (), data)
        if isinstance(value, str):  # np.str_
            return str.__str__(value)
        if isinstance(value, bytes):  # np.bytes_
            data = np.frombuffer(value, np.uint8)
            return self.placeholder("bytes", "|u1", data.shape, data)
        raise self.fail(path, f"{numpy_problem(dtype)} (got numpy scalar {value!r})")

    def encode_torch(self, value: Any, path: str, torch: Any) -> Any:
        problem = torch_problem(value, torch)
        if problem:
            raise self.fail(path, problem)
        try:
            data = tensor_as_numpy(value, torch)
        except (RuntimeError, TypeError, NotImplementedError) as exc:
            raise self.fail(path, f"cannot copy the tensor to CPU memory: {exc}") from exc
        name = str(value.dtype).removeprefix("torch.")
        return self.placeholder("torch", name, tuple(value.shape), data)

    def blob(self, row_id: str | None = None) -> bytes | None:
        """The blob of the tensors encoded so far; its checksum covers ``row_id`` too (a
        blob moved to another row no longer matches), or without one, its bytes only."""
        chunks = self.chunks
        if not chunks:
            return None
        magic, crc = (LEGACY_MAGIC, 0) if row_id is None else (MAGIC, row_seed(row_id))
        for chunk in chunks:
            crc = crc32(chunk, crc)
        return b"".join([magic, CRC.pack(crc), *chunks])


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


def encode_payload(
    payload: dict[str, Any], row_id: str | None = None, *, encoder: _Encoder | None = None
) -> tuple[dict[str, Any], bytes | None]:
    """Split ``payload`` into a JSON-able document and one blob of tensor bytes.

    The blob is None when the payload holds no arrays, tensors or bytes; its checksum
    covers ``row_id`` when given (as stored rows' blobs do). Top-level keys are
    field names and are kept as they are; below them, reserved keys are escaped. Raises
    CodecError naming the path (``state.obs[2]``) of the first value that cannot be stored.
    Every array stays in the blob (``PayloadWriter(threshold=...)`` stores large ones by
    digest).
    """
    encoder = _Encoder() if encoder is None else encoder
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
    return doc, encoder.blob(row_id)


def dump_document(doc: dict[str, Any]) -> str:
    """The compact JSON text a document is stored as."""
    return json.dumps(doc, allow_nan=False, separators=(",", ":"), ensure_ascii=False)


#: JSON text that may hold a float to tag: "-0.0" as a number, or an exponent "e+".
_TAGGED_TEXT = re.compile(r"-0\.0(?![0-9])|e\+")


class PayloadWriter:
    """Encodes many payloads to (JSON text, blob), as ``encode_payload`` plus
    :func:`dump_document` would, faster.

    The json module's C encoder walks the plain data and calls back only for arrays,
    tensors, bytes and pydantic models. Whatever it cannot settle alone (non-finite floats,
    keys or strings starting with "__" that may need escaping, unsupported values) goes
    through the full walk, so the result and every error are the same.

    ``PayloadWriter(threshold=n)`` stores arrays of at least ``n`` bytes by digest: their
    placeholders name the digest, and after each :meth:`encode`, :attr:`external` lists
    ``(digest, array)`` for the caller to store (see :mod:`expstore.codec.compression`).
    ``max_bytes`` refuses any larger array (CodecError).
    """

    def __init__(self, threshold: int | None = None, max_bytes: int | None = None) -> None:
        self.threshold = threshold
        self.max_bytes = max_bytes
        self._encoder = _Encoder(threshold, max_bytes)
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
            stored = FAST_DTYPE_NAMES.get(value.dtype)
            if stored is not None and type(value) is np.ndarray and value.flags.c_contiguous:
                return encoder.placeholder("numpy", stored, value.shape, value)
            return encoder.encode_numpy(value, "")
        torch = loaded_torch()
        if torch is not None and isinstance(value, torch.Tensor):
            return encoder.encode_torch(value, "", torch)
        if isinstance(value, (np.generic, bytes, bytearray, BaseModel)):
            return encoder.encode(value, "")
        raise _Unsettled

    def encode(
        self, payload: dict[str, Any], row_id: str | None = None
    ) -> tuple[str, bytes | None]:
        """``(document as JSON text, blob)`` for one payload (the blob's checksum covering
        ``row_id``); raises like encode_payload."""
        self._encoder = encoder = _Encoder(self.threshold, self.max_bytes)
        try:
            text = self._json(payload)
        except (_Unsettled, ValueError, TypeError, CodecError, RecursionError):
            pass
        else:
            # Each placeholder the encoder emitted holds '"__' exactly once; any other
            # occurrence is user data (a key or string starting with "__") that the full
            # walk may need to escape.
            # Floats the document must tag (-0.0, magnitudes from 1e16, written with an
            # exponent) take the full walk too.
            if text.count('"__') == encoder.tensors and not _TAGGED_TEXT.search(text):
                return _within_depth(payload, text), encoder.blob(row_id)
        self._encoder = encoder = _Encoder(self.threshold, self.max_bytes)
        doc, blob = encode_payload(payload, row_id, encoder=encoder)
        return _within_depth(payload, dump_document(doc)), blob

    @property
    def external(self) -> list[tuple[str, Any]]:
        """``(digest, array)`` of each array the last :meth:`encode` stored by digest."""
        return self._encoder.external


def _within_depth(payload: dict[str, Any], text: str) -> str:
    """``text``, after checking that no field nests deeper than MAX_DEPTH (a row changed
    after it was validated may); only a document with that many brackets can."""
    if text.count("[") + text.count("{") > MAX_DEPTH:
        for name, value in payload.items():
            if too_deep(value):
                raise depth_error(name)
    return text
