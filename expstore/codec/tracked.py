"""The digest of the value at a tracked path (``buffer.track_changes(path)``): what
``changed(path)`` compares once the path is tracked.

It is read from the stored form, the document's node at the path and the row's blob, so a
write (from the rows it just encoded) and a backfill (from the rows it reads) agree:

- an array, tensor or bytes (a placeholder): its content's digest, the one arrays stored
  once go by (:func:`~expstore.codec.digests.array_digest` of its dtype, shape and bytes),
  whether it is stored by digest or in the row's blob, so a small array compares by value
  too; a tensor's or bytes' digest also covers its kind;
- any other value: BLAKE2b-128 of its canonical JSON (keys sorted, arrays inside by their
  digests), so two values share a digest exactly when they are equal as stored;
- nothing at the path (or NULL in a column): None, which never compares equal.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from hashlib import blake2b
from typing import Any

import numpy as np

from .decode import PartDecoder
from .digests import array_digest
from .format import ESCAPED_KEY, TENSOR_KEY

__all__ = ["column_digest", "node_at", "value_digest"]

_MISSING = object()


def node_at(doc: Any, top: str, steps: Sequence[str | int], *, unescape: bool = False) -> Any:
    """The document's node at ``top`` and ``steps``, read as the conditions read a path (a
    key must meet an object, an index a list); :data:`_MISSING` when nothing is there.
    ``unescape``: a key also goes into an object the codec escaped because its keys are
    reserved (:data:`~expstore.codec.format.ESCAPED_KEY`), which conditions do not."""
    node = doc.get(top, _MISSING) if type(doc) is dict else _MISSING
    for step in steps:
        if node is _MISSING:
            return _MISSING
        if type(step) is int:
            if type(node) is not list or not 0 <= step < len(node):
                return _MISSING
            node = node[step]
        else:
            if unescape and type(node) is dict and len(node) == 1 and ESCAPED_KEY in node:
                node = node[ESCAPED_KEY]
            elif type(node) is not dict or _is_tensor(node):
                return _MISSING
            node = node.get(step, _MISSING)
    return node


def _is_tensor(node: Any) -> bool:
    return type(node) is dict and len(node) == 1 and TENSOR_KEY in node


def value_digest(node: Any, part: PartDecoder | None, path: str = "") -> str | None:
    """The digest of a document node (see the module); None for :data:`_MISSING`.
    ``part`` reads the arrays in the row's blob (None: the row has none)."""
    if node is _MISSING:
        return None
    if _is_tensor(node):
        kind, digest = _tensor_digest(node[TENSOR_KEY], part, path)
        if kind == "numpy":
            return digest
        return blake2b(f"{kind}|{digest}".encode(), digest_size=16).hexdigest()
    text = json.dumps(
        _canonical(node, part, path), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def column_digest(value: Any) -> str | None:
    """The digest of a column's value (None for NULL)."""
    if value is None:
        return None
    text = json.dumps(value, ensure_ascii=False)
    return blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _canonical(node: Any, part: PartDecoder | None, path: str) -> Any:
    kind = type(node)
    if kind is dict:
        if _is_tensor(node):
            tensor_kind, digest = _tensor_digest(node[TENSOR_KEY], part, path)
            return {TENSOR_KEY: {"kind": tensor_kind, "digest": digest}}
        return {k: _canonical(v, part, path) for k, v in node.items()}
    if kind is list:
        return [_canonical(v, part, path) for v in node]
    return node


def _tensor_digest(spec: Any, part: PartDecoder | None, path: str) -> tuple[str, str]:
    """(kind, content digest) of a tensor placeholder, checked as a read checks it."""
    if part is None:
        part = PartDecoder(None, "?")
    checked = part.tensor_spec(spec, path)
    if checked.digest is not None:
        return checked.kind, checked.digest
    if part.buf is None:
        raise part.damaged(f"{path} refers to tensor data but the row has no blob")
    if checked.offset + checked.nbytes > len(part.buf):
        raise part.damaged(f"{path} needs bytes beyond the end of the blob")
    array = np.frombuffer(part.buf, checked.dtype, checked.size, checked.offset)
    return checked.kind, array_digest(array.reshape(checked.shape))
