"""The codec: the free-form fields of an experience row as a JSON document plus one blob.

A payload is a dict of fields (``state``, ``actions``, ``messages``...), each holding JSON
values, pydantic models, numpy arrays and scalars, torch tensors and bytes, nested at any
depth. Ordinary JSON data stays exactly as it is in the document (queries run JSON paths
into it); everything JSON cannot hold becomes a placeholder pointing into the blob. Nothing
is ever pickled. Importing the codec does not import torch; decoding a stored torch tensor
imports it on demand.

- :mod:`~expstore.codec.format`: the placeholders, the blob's header and checksum, dtypes;
- :mod:`~expstore.codec.checks`: what can be stored, one rule per kind of value;
- :mod:`~expstore.codec.encode`: payload -> (document, blob);
- :mod:`~expstore.codec.decode`: (document, blob) -> payload;
- :mod:`~expstore.codec.batch`: one part of many rows at once, with a cache of placeholders;
- :mod:`~expstore.codec.documents`: whole documents of many rows, learning texts that repeat;
- :mod:`~expstore.codec.columns`: many rows' payloads encoded at once from columns;
- :mod:`~expstore.codec.values`: equality that treats arrays and tensors as values;
- :mod:`~expstore.codec.digests`: an array's digest (what arrays stored once go by);
- :mod:`~expstore.codec.compression`: how an array stored by digest is packed, chosen per
  array (zstd, byte-shuffle, PNG/WebP), and read back without trusting its sizes.

>>> import numpy as np
>>> doc, blob = encode_payload({"state": {"url": "a", "obs": np.zeros(2, np.float32)}})
>>> doc["state"]["url"], doc["state"]["obs"]["__tensor__"]["dtype"]
('a', '<f4')
>>> decode_payload(doc, blob, row_id="r1")["state"]["obs"]
array([0., 0.], dtype=float32)
"""

import json
from typing import Any

from .batch import BatchDecoder
from .checks import check_value, text_problem
from .decode import PartDecoder, decode_payload, plain_document
from .digests import array_digest
from .encode import PayloadWriter, dump_document, encode_payload
from .format import HEADER_SIZE, MAGIC, RESERVED_KEYS, TensorSpec
from .values import deep_equal, to_plain

__all__ = [
    "BatchDecoder",
    "decode_document",
    "HEADER_SIZE",
    "MAGIC",
    "PartDecoder",
    "PayloadWriter",
    "RESERVED_KEYS",
    "TensorSpec",
    "array_digest",
    "check_value",
    "decode_payload",
    "deep_equal",
    "dump_document",
    "encode_payload",
    "plain_document",
    "text_problem",
    "to_plain",
]


def decode_document(
    data: str | dict[str, Any], tensors: bytes | bytearray | memoryview | None, row_id: str
) -> dict[str, Any]:
    """A stored or exported row's payload from its ``data`` column (JSON text or the parsed
    object), its ``tensors`` column (the blob, or None) and its ``id``: arrays and tensors
    rebuilt with their dtype, shape and bits (see ``docs/format.md``). CodecError names the
    row when the blob's checksum or a placeholder does not hold."""
    from ..errors import CodecError

    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError:
            raise CodecError(f"row {row_id}: the data column is not JSON") from None
    return decode_payload(data, tensors, row_id=row_id)  # type: ignore[arg-type]
