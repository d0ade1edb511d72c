"""Batch decoding: one part of many rows, each given as JSON text as the database extracted
it, beside the row's blob.

A tensor placeholder's text is the same in every row that stores a tensor of that dtype
and shape at that place, so a :class:`BatchDecoder` keeps the checked spec of each text it
has seen: for most rows a numpy array costs a dict lookup, the blob's checksum and
``np.frombuffer``; a batch of one tensor field whose rows all hold the same placeholder
comes back as one stacked array with no per-row array at all. The caches belong to the
decoder object (a storage holds one), not to the module.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np

from ..errors import CodecError
from .compression import Unpacked as _Unpacked
from .compression import unpack_array
from .decode import Arrays, PartDecoder
from .format import (
    CRC_DTYPE,
    HEADER_SIZE,
    MAGIC_BYTES,
    TENSOR_KEY,
    TensorSpec,
    crc32,
    intact,
    row_seed,
)

__all__ = ["BatchDecoder"]

#: Parts kept by their text (:attr:`BatchDecoder.numbers`): Python numbers and booleans
#: whose text is at most this long.
_NUMBERS = (int, float, bool)
_NUMBER_TEXT = 64
#: Not among :attr:`BatchDecoder.numbers`.
_NOT_HELD = object()

Blob = bytes | bytearray | memoryview | None
#: Threads that unpack a batch's arrays stored by digest.
_UNPACKERS = min(8, os.cpu_count() or 1)


class _View(NamedTuple):
    """Where a numpy array in native byte order lies in its row's blob."""

    dtype: np.dtype[Any]
    size: int  # elements
    start: int  # in the blob, header included
    end: int
    shape: tuple[int, ...] | None  # None for 1-D (no reshape needed)


class BatchDecoder:
    """Decodes parts of many rows, remembering the checked placeholders it has seen.

    ``BatchDecoder(max_specs=4096)``: at most that many placeholder texts are kept; the
    cache starts afresh when it is full.
    """

    def __init__(self, max_specs: int = 4096) -> None:
        self.max_specs = max_specs
        #: Checked tensor specs by the JSON text of their placeholder.
        self.specs: dict[str, TensorSpec] = {}
        #: The numpy arrays among them, as read straight from a blob.
        self.views: dict[str, _View] = {}
        #: Numbers and booleans by their JSON text (an action, a flag: parts whose texts
        #: repeat across rows), each immutable, so rows share it.
        self.numbers: dict[str, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"max_specs": self.max_specs, "specs": {}, "views": {}, "numbers": {}}

    def remember(self, text: str, spec: TensorSpec) -> None:
        if len(self.specs) >= self.max_specs:
            self.specs.clear()
            self.views.clear()
        self.specs[text] = spec
        if spec.kind == "numpy" and spec.dtype.isnative and spec.digest is None:
            start = HEADER_SIZE + spec.offset
            shape = spec.shape if len(spec.shape) != 1 else None
            self.views[text] = _View(spec.dtype, spec.size, start, start + spec.nbytes, shape)

    def learn(self, text: str, row_id: str, path: str) -> None:
        """Remember ``text``'s spec if it is a valid tensor placeholder (anything else is
        left for :meth:`decode_text` to decode or explain)."""
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            return
        if type(value) is dict and len(value) == 1 and TENSOR_KEY in value:
            try:
                self.remember(text, PartDecoder(None, row_id).tensor_spec(value[TENSOR_KEY], path))
            except CodecError:
                return

    def decode_text(
        self, text: str, blob: Blob, row_id: str, path: str, arrays: Arrays | None = None
    ) -> Any:
        """One row's part given as JSON text: what decoding the whole row gives there
        (``arrays``: the stored arrays it may refer to by digest)."""
        part = PartDecoder(blob, row_id, arrays)
        spec = self.specs.get(text)
        if spec is not None:
            return part.tensor_at(spec, path)
        try:
            value = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise part.malformed(path, f"text that is not JSON ({type(exc).__name__})") from None
        if type(value) is dict and len(value) == 1 and TENSOR_KEY in value:
            spec = part.tensor_spec(value[TENSOR_KEY], path)
            self.remember(text, spec)
            return part.tensor_at(spec, path)
        return part.decode_part(value, path)

    def decode_texts(
        self,
        texts: Sequence[str | None],
        blobs: Sequence[Blob],
        row_ids: Sequence[str],
        path: str,
        *,
        writable: bool = True,
        checked: set[int] | None = None,
        stack: bool = False,
        arrays: Arrays | None = None,
    ) -> list[Any] | np.ndarray:
        """:meth:`decode_text` for each row, None where a text is None (SQL NULL).

        With ``stack=True``, when every row holds a numpy array of one dtype and shape (of
        at least one dimension) there, as a tensor field does, the result is instead one
        read-only array whose first axis runs over the rows, a view of the rows' blobs
        joined (see :meth:`stacked`); otherwise the list.

        ``writable=False`` lets arrays be read-only views of the blobs, for a caller that
        copies them anyway (a converter stacking a batch). ``checked`` holds the ``id()``
        of blobs already verified, so that several parts of one row check its blob once;
        its blobs must stay alive while it is in use. ``arrays``: the stored arrays the
        rows refer to by digest.
        """
        if stack and texts and texts[0] is not None:
            if texts[0] not in self.specs:  # learn the placeholder from the first row
                self.learn(texts[0], row_ids[0], path)
            stacked = self.stacked(texts, blobs, row_ids, checked)
            if stacked is not None:
                return stacked
        if arrays and len(texts) > 1:
            arrays = self.unpacked(texts, row_ids, path, arrays)
        views, numbers = self.views, self.numbers
        frombuffer = np.frombuffer
        out: list[Any] = []
        append = out.append
        given: set[int] = set()
        for text, blob, row_id in zip(texts, blobs, row_ids, strict=True):
            number = numbers.get(text, _NOT_HELD)  # type: ignore[arg-type]
            if number is not _NOT_HELD:
                append(number)
                continue
            view = views.get(text)  # type: ignore[arg-type]  # None is never a key
            if view is not None and type(blob) is bytes and len(blob) >= view.end:
                if (checked is not None and id(blob) in checked) or intact(blob, row_id):
                    dtype, size, start, end, shape = view
                    if writable:
                        array = frombuffer(bytearray(memoryview(blob)[start:end]), dtype, size)
                    else:
                        array = frombuffer(blob, dtype, size, start)
                    append(array if shape is None else array.reshape(shape))
                    if checked is not None:
                        checked.add(id(blob))
                    continue
            value = None if text is None else self.decode_text(text, blob, row_id, path, arrays)
            if type(value) in _NUMBERS and len(text) <= _NUMBER_TEXT:  # type: ignore[arg-type]
                if len(numbers) >= self.max_specs:
                    numbers.clear()
                numbers[text] = value  # type: ignore[index]
            if type(value) is np.ndarray and value.base is not None and arrays:
                # An array unpacked once for rows that share it: each row gets its own
                # when they may be written to.
                if writable and id(value.base) in given:
                    value = value.copy()
                given.add(id(value.base))
            append(value)
        return out

    def unpacked(
        self, texts: Sequence[str | None], row_ids: Sequence[str], path: str, arrays: Arrays
    ) -> Arrays:
        """``arrays`` with the ones these rows refer to by digest unpacked already, each
        once, in threads (zstd and Pillow release the GIL): a batch of screenshots
        decompresses on every core. Whatever does not unpack is left for the row's own
        decoding, which names the row."""
        wanted: dict[str, TensorSpec] = {}
        for text, row_id in zip(texts, row_ids, strict=True):
            if text is None:
                continue
            spec = self.specs.get(text)
            if spec is None and '"digest"' in text:
                self.learn(text, row_id, path)
                spec = self.specs.get(text)
            if spec is not None and spec.digest is not None and spec.digest in arrays:
                wanted.setdefault(spec.digest, spec)
        if len(wanted) < 2:
            return arrays

        def unpack(spec: TensorSpec) -> Any:
            assert spec.digest is not None
            try:
                return unpack_array(arrays[spec.digest], spec.digest, spec.dtype, spec.shape, "")
            except CodecError:
                return arrays[spec.digest]  # decoded again by the row, which names it

        with ThreadPoolExecutor(min(len(wanted), _UNPACKERS)) as pool:
            done = dict(zip(wanted, pool.map(unpack, wanted.values()), strict=True))
        return {**arrays, **{d: _Unpacked(a) for d, a in done.items() if type(a) is np.ndarray}}

    def stacked(
        self,
        texts: Sequence[str | None],
        blobs: Sequence[Blob],
        row_ids: Sequence[str],
        checked: set[int] | None,
    ) -> np.ndarray | None:
        """The arrays of a batch of rows as one read-only ``(rows, *shape)`` array, when
        every row has the same known placeholder text and blobs of one length, all intact;
        else None (the caller decodes row by row, which explains any damage).

        The blobs are joined into one buffer and viewed with a row stride, so there is no
        per-row array: the cost beyond the join is each blob's checksum.
        """
        first = texts[0]
        view = self.views.get(first)  # type: ignore[arg-type]  # None is never a key
        if view is None or view.shape == () or texts.count(first) != len(texts):
            return None
        size = len(blobs[0]) if type(blobs[0]) is bytes else 0
        if size < view.end or set(map(type, blobs)) != {bytes} or set(map(len, blobs)) != {size}:  # type: ignore[arg-type]
            return None
        joined = b"".join(blobs)  # type: ignore[arg-type]
        table = np.frombuffer(joined, np.uint8).reshape(len(blobs), size)
        if checked is None or not all(id(b) in checked for b in blobs):
            if not (table[:, :4] == MAGIC_BYTES).all():
                return None  # (blobs written before revision 0005 are read row by row)
            whole = memoryview(joined)
            sums = np.fromiter(
                (
                    crc32(whole[at + HEADER_SIZE : at + size], row_seed(row_id))
                    for at, row_id in zip(range(0, len(joined), size), row_ids, strict=True)
                ),
                np.uint32,
                len(blobs),
            )
            if not np.array_equal(sums, table[:, 4:HEADER_SIZE].copy().view(CRC_DTYPE).ravel()):
                return None
            if checked is not None:
                checked.update(map(id, blobs))
        arrays = table[:, view.start : view.end].view(view.dtype)
        return arrays if view.shape is None else arrays.reshape(len(blobs), *view.shape)
