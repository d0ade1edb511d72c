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
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from itertools import repeat
from operator import eq, getitem, itemgetter
from typing import Any

import numpy as np

from ..errors import CodecError
from .decode import PartDecoder, _Decoder
from .format import CRC, HEADER_SIZE, MAGIC, RESERVED_KEYS, TENSOR_KEY, TensorSpec, crc32

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
        """The payload of one row with this text (see :meth:`build_many`)."""
        return self.build_many([blob], [row_id])[0]

    def build_many(self, blobs: list[Blob], row_ids: list[str]) -> list[dict[str, Any]]:
        """The payloads of rows with this text, in order. When every blob is intact (bytes
        with the magic, long enough, the checksum each should carry as its row's), each
        row's tensor bytes are copied once (writable, its own) and viewed: the checks,
        copies and views run over the whole batch at once, in C. Anything else, damage
        included, goes row by row through the general decoder, which names the row."""
        arrays = self.arrays
        if arrays is not None and _intact(blobs, row_ids, self.end):
            bodies: Iterable[memoryview] = map(getitem, map(memoryview, blobs), repeat(_BODY))  # type: ignore[arg-type]
            copies = list(map(bytearray, bodies))
            n = len(copies)
            columns = [
                map(frombuffer, copies, repeat(dtype, n), repeat(size, n), repeat(offset, n))
                if shape is None
                else map(
                    np.ndarray.reshape,
                    map(frombuffer, copies, repeat(dtype, n), repeat(size, n), repeat(offset, n)),
                    repeat(shape, n),
                )
                for dtype, size, offset, shape in arrays
            ]
            per_row = zip(*columns, strict=True)
        else:
            per_row = map(self._tensors, blobs, row_ids)  # type: ignore[assignment]
        make = self.make
        return [make(iter(made).__next__) for made in per_row]

    def _tensors(self, blob: Blob, row_id: str) -> list[Any]:
        at = PartDecoder(blob, row_id).tensor_at
        return [at(spec, path) for spec, path in self.tensors]


def _intact(blobs: list[Blob], row_ids: list[str], end: int) -> bool:
    """Whether every blob is bytes, at least ``end`` long, with the magic and the checksum
    it should carry as its row's blob (the common case, checked over the whole batch)."""
    n = len(blobs)
    if not n:
        return True
    if not all(type(b) is bytes for b in blobs) or min(map(len, blobs)) < end:  # type: ignore[arg-type]
        return False
    if not all(map(bytes.startswith, blobs, repeat(MAGIC, n))):  # type: ignore[arg-type]
        return False
    seeds = map(crc32, map(str.encode, row_ids, repeat("utf-8", n), repeat("surrogatepass", n)))
    sums = map(crc32, map(getitem, map(memoryview, blobs), repeat(_BODY, n)), seeds)  # type: ignore[arg-type]
    stored = map(_first, map(CRC.unpack_from, blobs, repeat(4, n)))  # type: ignore[arg-type]
    return all(map(eq, sums, stored))


#: A blob's bytes after its header.
_BODY = slice(HEADER_SIZE, None)
_first = itemgetter(0)


frombuffer = np.frombuffer


class _Slot:
    """Where the skeleton holds a tensor."""


_SLOT = _Slot()
Take = Callable[[], Any]
Maker = Callable[[Take], Any]


def _maker(node: Any) -> Maker:
    """A function of ``take`` (the row's next tensor, in document order) making a fresh copy
    of the container ``node`` with the tensors put in their places.

    The copy is a shallow one of ``node`` (scalars are immutable and shared), after which
    only the places holding a tensor or a container are filled, in document order: a
    typical row (a dict of a few fields, one of them a dict holding the tensor) costs two
    copies and two assignments."""
    places = node.items() if type(node) is dict else enumerate(node)
    fills = [
        (place, _take if value is _SLOT else _maker(value))
        for place, value in places
        if value is _SLOT or type(value) in (dict, list)
    ]
    if not fills:
        return partial(_copy, node)
    return partial(_fill, node, fills)


def _take(take: Take) -> Any:
    return take()


def _copy(node: Any, take: Take) -> Any:
    return node.copy()


def _fill(node: Any, fills: list[tuple[Any, Maker]], take: Take) -> Any:
    made = node.copy()
    for place, make in fills:
        made[place] = make(take)
    return made


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
        return self.decode_many([text], [blob], [row_id])[0]

    def decode_many(
        self, texts: Sequence[Any], blobs: Sequence[Blob], row_ids: Sequence[str]
    ) -> list[dict[str, Any] | None]:
        """:meth:`decode` of many rows: the rows of each learned text are built together
        (:meth:`_Template.build_many`)."""
        out: list[dict[str, Any] | None] = [None] * len(texts)
        groups: dict[int, tuple[_Template, list[int]]] = {}
        for at, text in enumerate(texts):
            template = self.template(text) if type(text) is str else None
            if template is not None:
                group = groups.get(id(template))
                if group is None:
                    groups[id(template)] = (template, [at])
                else:
                    group[1].append(at)
        for template, places in groups.values():
            built = template.build_many([blobs[i] for i in places], [row_ids[i] for i in places])
            for at, payload in zip(places, built, strict=True):
                out[at] = payload
        return out


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
    if any(spec.digest is not None for spec, _ in tensors):
        return None  # arrays stored by digest: their text names the digest, it rarely repeats
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
