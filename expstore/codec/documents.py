"""Whole documents of many rows, remembering the documents whose text repeats.

Rows of one kind (an observation tensor, a few fixed fields) are stored with the very same
document text: the placeholders name the same dtype, shape and offset in every row, and
only the blob differs. A :class:`DocumentDecoder` learns such a text the second time it
sees it: the document parsed and its placeholders checked once, kept as a *skeleton* (the
document with its tensors left out) and where each tensor goes. A row with a learned text
is then a copy of the skeleton plus its tensors read from its own blob (checksum checked,
one writable copy per row, as :func:`~expstore.codec.decode.decode_payload` gives). Texts
with tagged floats, escaped dicts or anything unusual are not learned: they are decoded by
the full walk each time, as are texts seen once.

The caches belong to the decoder object (a storage holds one) and are bounded.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from ..errors import CodecError
from .decode import PartDecoder, _Decoder
from .format import CRC, HEADER_SIZE, MAGIC, RESERVED_KEYS, TENSOR_KEY, TensorSpec, crc32, row_seed

__all__ = ["DocumentDecoder"]

#: What every document with a tensor holds (the only ones worth learning).
_TENSOR_TEXT = f'"{TENSOR_KEY}"'

Blob = bytes | bytearray | memoryview | None


class _NotPlain(Exception):
    """A document the skeleton cannot express."""


class _Template:
    """A learned document: a function that rebuilds it around a row's tensors."""

    __slots__ = ("arrays", "end", "make", "tensors")

    def __init__(self, skeleton: dict[str, Any], tensors: list[tuple[TensorSpec, str]]) -> None:
        self.make = _maker(skeleton)
        self.tensors = tensors
        #: (dtype, size, offset, shape or None) of each tensor when all are numpy arrays in
        #: native byte order (the common case, read without the general decoder); else None.
        self.arrays: list[tuple[Any, int, int, tuple[int, ...] | None]] | None = [
            (spec.dtype, spec.size, spec.offset, spec.shape if len(spec.shape) != 1 else None)
            for spec, _ in tensors
        ]
        if not all(spec.kind == "numpy" and spec.dtype.isnative for spec, _ in tensors):
            self.arrays = None
        self.end = HEADER_SIZE + max((s.offset + s.nbytes for s, _ in tensors), default=0)

    def build(self, blob: Blob, row_id: str) -> dict[str, Any]:
        if not self.tensors:
            return self.make(_none)  # type: ignore[no-any-return]
        arrays = self.arrays
        if (
            arrays is not None
            and type(blob) is bytes
            and len(blob) >= self.end
            and blob.startswith(MAGIC)
            and crc32(memoryview(blob)[HEADER_SIZE:], row_seed(row_id))
            == CRC.unpack_from(blob, 4)[0]
        ):
            # The checksum holds: one writable copy of the row's tensor bytes, viewed.
            buf = bytearray(memoryview(blob)[HEADER_SIZE:])
            made = [
                frombuffer(buf, dtype, size, offset)
                if shape is None
                else frombuffer(buf, dtype, size, offset).reshape(shape)
                for dtype, size, offset, shape in arrays
            ]
        else:  # anything else, damage included, as the decoder says
            at = PartDecoder(blob, row_id).tensor_at
            made = [at(spec, path) for spec, path in self.tensors]
        return self.make(iter(made).__next__)  # type: ignore[no-any-return]


frombuffer = np.frombuffer


def _none() -> None:  # pragma: no cover - a template without tensors never calls it
    return None


class _Slot:
    """Where the skeleton holds a tensor."""


_SLOT = _Slot()
Maker = Callable[[Callable[[], Any]], Any]


def _maker(node: Any) -> Maker:
    """A function of ``take`` (the row's next tensor, in document order) making a fresh copy
    of ``node``'s containers with the tensors put in their places."""
    if node is _SLOT:
        return _take
    kind = type(node)
    if kind is not dict and kind is not list:
        return partial(_same, node)
    values = list(node.values()) if kind is dict else node
    if all(type(v) not in (dict, list) and v is not _SLOT for v in values):
        return partial(_flat_copy, node)  # no containers inside: a shallow copy
    if kind is dict:
        return partial(_make_dict, [(k, *_part(v)) for k, v in node.items()])
    return partial(_make_list, [_part(v) for v in node])


def _part(value: Any) -> tuple[Maker | None, Any]:
    """(the maker of a value inside a container, or None for a scalar kept as it is;
    the value)."""
    if value is not _SLOT and type(value) not in (dict, list):
        return None, value
    return _maker(value), value


def _take(take: Callable[[], Any]) -> Any:
    return take()


def _same(value: Any, take: Callable[[], Any]) -> Any:
    return value


def _flat_copy(node: Any, take: Callable[[], Any]) -> Any:
    return node.copy()


def _make_dict(
    parts: list[tuple[str, Maker | None, Any]], take: Callable[[], Any]
) -> dict[str, Any]:
    return {key: value if make is None else make(take) for key, make, value in parts}


def _make_list(parts: list[tuple[Maker | None, Any]], take: Callable[[], Any]) -> list[Any]:
    return [value if make is None else make(take) for make, value in parts]


class DocumentDecoder:
    """Decodes whole stored documents (JSON text and blob) of many rows; see the module doc.

    ``DocumentDecoder(max_texts=512, max_length=4096)``: only texts holding a tensor
    placeholder and at most ``max_length`` characters long are learned, on their second
    sight; at most ``max_texts`` are kept. When the cache is full, it starts afresh only if
    it was hit more often than it learned since it last did; otherwise (texts that repeat
    too rarely to pay for learning them) learning stops for ``64 * max_texts`` documents.
    """

    def __init__(self, max_texts: int = 512, max_length: int = 4096) -> None:
        self.max_texts = max_texts
        self.max_length = max_length
        self.templates: dict[str, _Template | None] = {}
        self.seen: set[str] = set()
        self.hits = 0
        self.resting = 0  # documents left before learning resumes

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "templates": {}, "seen": set(), "hits": 0, "resting": 0}

    def template(self, text: str) -> _Template | None:
        """The learned template of ``text``, if any (learning it on its second sight)."""
        found = self.templates.get(text)
        if found is not None:
            self.hits += 1
            return found
        if text in self.templates or len(text) > self.max_length:
            return None
        if self.resting:
            self.resting -= 1
            return None
        if text not in self.seen:
            if _TENSOR_TEXT in text:
                if len(self.seen) >= self.max_texts:
                    self.seen.clear()
                self.seen.add(text)
            return None
        if len(self.templates) >= self.max_texts:
            useful = self.hits > len(self.templates)
            self.templates.clear()
            self.seen.clear()
            self.hits = 0
            if not useful:
                self.resting = 64 * self.max_texts
                return None
        self.templates[text] = learned = _learn(text)
        return learned

    def decode(self, text: str, blob: Blob, row_id: str) -> dict[str, Any] | None:
        """The payload of a document whose text was learned, or None (the caller parses and
        decodes it the full way, which also explains any damage)."""
        template = self.template(text)
        return None if template is None else template.build(blob, row_id)


def _learn(text: str) -> _Template | None:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if type(doc) is not dict:
        return None
    tensors: list[tuple[TensorSpec, str]] = []
    checker = _Decoder(None, "")
    try:
        skeleton = _walk(doc, "", tensors, checker)
    except (_NotPlain, CodecError, RecursionError):
        return None
    if not tensors:  # (a string that reads "__tensor__"): the full decoder checks the blob
        return None
    return _Template(skeleton, tensors)


def _walk(value: Any, path: str, tensors: list[tuple[TensorSpec, str]], checker: _Decoder) -> Any:
    """``value`` with each tensor placeholder replaced by the slot marker, noting each
    tensor's checked spec in document order."""
    kind = type(value)
    if kind is dict:
        if not RESERVED_KEYS.isdisjoint(value):
            raise _NotPlain
        return {
            key: _item(item, f"{path}.{key}" if path else key, tensors, checker)
            for key, item in value.items()
        }
    if kind is list:
        return [_item(item, f"{path}[{i}]", tensors, checker) for i, item in enumerate(value)]
    return value


def _item(item: Any, path: str, tensors: list[tuple[TensorSpec, str]], checker: _Decoder) -> Any:
    if type(item) is dict and len(item) == 1 and TENSOR_KEY in item:
        tensors.append((checker.tensor_spec(item[TENSOR_KEY], path), path))
        return _SLOT
    return _walk(item, path, tensors, checker)
