"""Placeholders of arrays stored by digest: what the encoder writes and the decoder
checks (the bytes themselves: test_compression.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from expstore.codec import PayloadWriter, decode_payload, encode_payload
from expstore.codec.compression import EXTERNAL_THRESHOLD, pack_array
from expstore.codec.digests import array_digest
from expstore.errors import CodecError, CorruptRowError

BIG = np.arange(EXTERNAL_THRESHOLD, dtype=np.uint8).reshape(256, -1)
SMALL = np.arange(16, dtype=np.float32)


def test_a_writer_with_a_threshold_refers_to_large_arrays_by_digest() -> None:
    writer = PayloadWriter(EXTERNAL_THRESHOLD)
    text, blob = writer.encode({"state": {"screen": BIG, "obs": SMALL}}, "r1")
    doc = json.loads(text)
    digest = array_digest(BIG)
    assert doc["state"]["screen"] == {
        "__tensor__": {"kind": "numpy", "dtype": "|u1", "shape": [256, 256], "digest": digest}
    }
    assert doc["state"]["obs"]["__tensor__"]["nbytes"] == SMALL.nbytes  # in the blob
    assert [d for d, _ in writer.external] == [digest]
    arrays = {digest: pack_array(BIG, digest, "zstd")}
    back = decode_payload(doc, blob, row_id="r1", arrays=arrays)
    assert np.array_equal(back["state"]["screen"], BIG)
    assert np.array_equal(back["state"]["obs"], SMALL)


def test_encode_payload_keeps_every_array_in_the_blob() -> None:
    """What exports write: self-contained rows, arrays and not references."""
    doc, blob = encode_payload({"state": {"screen": BIG}}, "r1")
    assert "digest" not in doc["state"]["screen"]["__tensor__"]
    assert np.array_equal(decode_payload(doc, blob, row_id="r1")["state"]["screen"], BIG)


def test_an_array_over_the_maximum_is_refused_with_its_path() -> None:
    writer = PayloadWriter(EXTERNAL_THRESHOLD, max_bytes=EXTERNAL_THRESHOLD - 1)
    with pytest.raises(CodecError, match=r"state\.screen: the array of 65536 bytes .* over"):
        writer.encode({"state": {"screen": BIG}}, "r1")


def test_a_missing_stored_array_is_a_corrupt_row() -> None:
    writer = PayloadWriter(EXTERNAL_THRESHOLD)
    text, blob = writer.encode({"state": {"screen": BIG}}, "r1")
    with pytest.raises(CorruptRowError, match=r"row r1: state\.screen refers to the array"):
        decode_payload(json.loads(text), blob, row_id="r1", arrays={})


@pytest.mark.parametrize(
    "spec",
    [
        {"kind": "numpy", "dtype": "|u1", "shape": [2], "digest": "xyz"},
        {"kind": "bytes", "dtype": "|u1", "shape": [2], "digest": "0" * 32},
        {"kind": "numpy", "dtype": "|O", "shape": [2], "digest": "0" * 32},
        {"kind": "numpy", "dtype": "|u1", "shape": [-2], "digest": "0" * 32},
    ],
)
def test_a_malformed_digest_placeholder_is_refused(spec: dict) -> None:
    with pytest.raises(CodecError, match="row r1"):
        decode_payload({"state": {"x": {"__tensor__": spec}}}, None, row_id="r1", arrays={})
