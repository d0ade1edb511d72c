"""DocumentDecoder: a document text seen twice is decoded from a learned skeleton, giving
exactly what the full decoder gives, in fresh containers and writable arrays of the row's
own blob; damage is still reported naming the row; the caches stay bounded."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from expstore.codec import PayloadWriter, decode_payload, deep_equal
from expstore.codec.documents import DocumentDecoder
from expstore.errors import CodecError
from tests.codec.test_codec import nested


def _stored(payload: dict[str, Any], row_id: str) -> tuple[str, bytes | None]:
    return PayloadWriter().encode(payload, row_id)


def _full(text: str, blob: bytes | None, row_id: str) -> dict[str, Any]:
    return decode_payload(json.loads(text), blob, row_id=row_id)


def _obs(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "state": {
            "obs": rng.random((3, 2), dtype=np.float32),
            "frames": [rng.integers(0, 9, 4, dtype=np.uint8), {"m": torch.ones(2)}],
            "url": "u",
        },
        "actions": [],
        "messages": None,
        "next_state": {"obs": rng.random(2)},
        "ext_info": {"k": [1, {"a": None}]},
    }


def test_a_repeated_text_is_learned_and_decodes_as_the_full_decoder() -> None:
    decoder = DocumentDecoder()
    texts_blobs = [_stored(_obs(i), f"r{i}") for i in range(4)]
    assert len({t for t, _ in texts_blobs}) == 1  # the same text, other bytes
    assert decoder.decode(texts_blobs[0][0], texts_blobs[0][1], "r0") is None  # seen once
    for i, (text, blob) in enumerate(texts_blobs):
        got = decoder.decode(text, blob, f"r{i}")
        assert got is not None
        assert deep_equal(got, _full(text, blob, f"r{i}"))
        assert deep_equal(got, _obs(i))
        assert type(got["state"]["frames"][1]["m"]) is torch.Tensor


def test_learned_rows_get_fresh_containers_and_writable_arrays_of_their_own() -> None:
    decoder = DocumentDecoder()
    text, blob = _stored(_obs(0), "r0")
    decoder.template(text)
    first = decoder.decode(text, blob, "r0")
    second = decoder.decode(text, blob, "r0")
    assert first is not None and second is not None
    first["state"]["url"] = "changed"
    first["ext_info"]["k"][1]["a"] = 5
    first["state"]["obs"][0, 0] = -1.0  # writable, and not shared with the next row
    assert second["state"]["url"] == "u" and second["ext_info"]["k"][1]["a"] is None
    assert second["state"]["obs"][0, 0] != -1.0
    third = decoder.decode(text, blob, "r0")
    assert third is not None and deep_equal(third, _full(text, blob, "r0"))


@pytest.mark.parametrize(
    "payload",
    [
        {"state": {"x": float("nan")}},  # a tagged float
        {"state": {"__tensor__": 1}},  # an escaped dict
        {"state": b"raw"},  # bytes are learned like tensors
        {"state": 1, "actions": [np.float32(2.0)]},  # a numpy scalar in a list
    ],
)
def test_unusual_documents_decode_the_same_learned_or_not(payload: dict[str, Any]) -> None:
    decoder = DocumentDecoder()
    text, blob = _stored(payload, "r")
    for _ in range(3):
        got = decoder.decode(text, blob, "r")
        full = _full(text, blob, "r")
        assert got is None or deep_equal(got, full)
        assert deep_equal(full, payload)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(["state", "actions", "ext_info"]), nested))
def test_any_payload_learned_decodes_as_the_full_decoder(payload: dict[str, Any]) -> None:
    decoder = DocumentDecoder()
    text, blob = _stored(payload, "row")
    decoder.template(text)
    got = decoder.decode(text, blob, "row")
    if got is not None:
        assert deep_equal(got, _full(text, blob, "row"))
        assert deep_equal(got, payload)


def test_damage_is_reported_naming_the_row_for_a_learned_text() -> None:
    decoder = DocumentDecoder()
    text, blob = _stored(_obs(0), "r0")
    assert blob is not None
    decoder.template(text)
    assert decoder.template(text) is not None
    flipped = bytearray(blob)
    flipped[-1] ^= 1
    for bad, words in (
        (bytes(flipped), "checksum"),
        (blob[:-8], "checksum"),
        (None, "no blob"),
    ):
        with pytest.raises(CodecError, match=words) as info:
            decoder.decode(text, bad, "r0")
        assert "row r0" in str(info.value)
    with pytest.raises(CodecError, match="checksum"):
        decoder.decode(text, blob, "another-row")  # a blob copied from another row


def test_a_batch_decodes_as_each_row_alone_with_arrays_of_its_own() -> None:
    # Rows of two learned texts, one text seen once and a document without tensors,
    # interleaved: decode_many builds each learned text's rows together.
    decoder = DocumentDecoder()
    other = {"state": {"img": np.arange(6, dtype=np.int16).reshape(2, 3)}, "actions": [1]}
    payloads = [_obs(i) if i % 3 else other for i in range(9)]
    payloads += [{"state": {"once": np.ones(1)}}, {"state": {"plain": 1}}]
    stored = [_stored(p, f"r{i}") for i, p in enumerate(payloads)]
    for text, _ in stored[:-2]:
        decoder.template(text)  # seen once: learned on the second sight, below
    got = decoder.decode_many(
        [t for t, _ in stored], [b for _, b in stored], [f"r{i}" for i in range(11)]
    )
    assert got[-2] is None and got[-1] is None  # left to the full decoder
    for i, payload in enumerate(got[:-2]):
        assert payload is not None and deep_equal(payload, payloads[i])
    arrays = [p["state"]["obs"] for p in got[1:9] if p is not None and "obs" in p["state"]]
    assert len(arrays) == 6 and all(a.flags.writeable for a in arrays)
    arrays[0][...] = -1.0  # each row's bytes are its own
    assert all(not np.shares_memory(arrays[0], a) for a in arrays[1:])
    assert all((a != -1.0).all() for a in arrays[1:])


def test_one_damaged_blob_in_a_batch_is_reported_naming_its_row() -> None:
    decoder = DocumentDecoder()
    stored = [_stored(_obs(i), f"r{i}") for i in range(5)]
    text = stored[0][0]
    decoder.template(text)
    blobs = [b for _, b in stored]
    flipped = bytearray(blobs[3] or b"")
    flipped[-2] ^= 4
    blobs[3] = bytes(flipped)
    with pytest.raises(CodecError, match="checksum") as info:
        decoder.decode_many([text] * 5, blobs, [f"r{i}" for i in range(5)])
    assert "row r3" in str(info.value)
    swapped = [b for _, b in stored]
    swapped[1], swapped[2] = swapped[2], swapped[1]  # blobs moved between rows
    with pytest.raises(CodecError, match="row r1"):
        decoder.decode_many([text] * 5, swapped, [f"r{i}" for i in range(5)])


def test_malformed_placeholders_are_never_learned() -> None:
    decoder = DocumentDecoder()
    text = json.dumps(
        {
            "state": {
                "__tensor__": {
                    "kind": "pickle",
                    "dtype": "<f8",
                    "shape": [1],
                    "offset": 0,
                    "nbytes": 8,
                }
            }
        }
    )
    decoder.template(text)
    assert decoder.template(text) is None
    assert decoder.decode(text, None, "r") is None  # the full decoder explains it


def test_only_documents_with_tensors_are_learned() -> None:
    decoder = DocumentDecoder()
    text = json.dumps({"state": {"x": 1}, "actions": []})
    for _ in range(3):
        assert decoder.template(text) is None
    assert not decoder.seen and not decoder.templates


def _texts(count: int, start: int = 0) -> list[tuple[str, bytes | None]]:
    return [_stored({"state": np.zeros(i, np.float32)}, "r") for i in range(start, start + count)]


def test_the_caches_are_bounded_and_learning_rests_when_it_does_not_pay() -> None:
    decoder = DocumentDecoder(max_texts=8, max_length=200)
    for text, _ in _texts(20):  # each seen twice, never again: learning does not pay
        decoder.template(text)
        decoder.template(text)
        assert len(decoder.seen) <= 8 and len(decoder.templates) <= 8
    assert decoder.resting > 0
    text, blob = _texts(1, start=100)[0]
    for _ in range(3):
        assert decoder.decode(text, blob, "r") is None  # resting: decoded the full way
    long_text = json.dumps({"state": {"__tensor__": "x" * 300}})
    fresh = DocumentDecoder(max_texts=8, max_length=200)
    for _ in range(3):
        assert fresh.template(long_text) is None
    assert long_text not in fresh.seen


def test_a_cache_that_pays_starts_afresh_when_full() -> None:
    decoder = DocumentDecoder(max_texts=4)
    first = _texts(4)
    for _ in range(5):  # learned, then hit again and again
        for text, blob in first:
            decoder.decode(text, blob, "r")
    assert len(decoder.templates) == 4 and decoder.hits > 4
    newer = _texts(2, start=50)
    for text, _ in newer:
        decoder.template(text)
        decoder.template(text)
    assert not decoder.resting
    text, blob = newer[1]
    assert decoder.decode(text, blob, "r") is not None


def test_sampled_rows_equal_stored_rows_and_the_collector_is_left_as_it_was(
    db_url: str, buffer_name: str
) -> None:
    import gc

    from expstore import DataRow, Experience, ExpMeta, ReplayBuffer, UniformSampler

    rows = [
        DataRow(
            exp_meta=ExpMeta(task_id=f"t{i}", agent_id="a", step=i),
            exp_data=Experience(**{k: v for k, v in _obs(i).items() if k != "messages"}),
        )
        for i in range(6)
    ]
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(rows)
        by_id = {r.id: r for r in rows}
        for enabled in (True, False, True):
            (gc.enable if enabled else gc.disable)()
            try:
                for _ in range(3):  # learned from the second sight on
                    for got in buffer.sample(UniformSampler(seed=1), batch_size=12):
                        want = by_id[got.id]
                        assert got.exp_meta == want.exp_meta
                        assert deep_equal(dict(got.exp_data), dict(want.exp_data))
                    assert gc.isenabled() is enabled
            finally:
                gc.enable()


def test_a_text_that_only_mentions_a_tensor_key_still_has_its_blob_checked() -> None:
    decoder = DocumentDecoder()
    text = json.dumps({"state": "__tensor__", "actions": []})
    for _ in range(3):
        assert decoder.decode(text, b"garbage!", "r") is None  # the full decoder explains
    with pytest.raises(CodecError):
        decode_payload(json.loads(text), b"garbage!", row_id="r")
