"""Tests for expstore.codec: exact round trips, damaged data, unsupported values, no pickle."""

from __future__ import annotations

import datetime
import enum
import json
import math
import pickle
import struct
import subprocess
import sys
import uuid
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays
from pydantic import BaseModel, ConfigDict

from expstore.codec import (
    PayloadWriter,
    check_value,
    decode_payload,
    deep_equal,
    dump_document,
    encode_payload,
    to_plain,
)
from expstore.errors import CodecError

ROW = "r-42"

NUMPY_DTYPES = [
    np.dtype(t)
    for t in (
        np.bool_,
        np.int8, np.int16, np.int32, np.int64,
        np.uint8, np.uint16, np.uint32, np.uint64,
        np.float16, np.float32, np.float64, np.longdouble,
        np.complex64, np.complex128, np.clongdouble,
    )
]  # fmt: skip

# torch dtype -> numpy dtype whose bits build it (viewed when numpy has no equivalent)
TORCH_DTYPES: dict[torch.dtype, np.dtype[Any]] = {
    torch.bool: np.dtype(np.bool_),
    torch.uint8: np.dtype(np.uint8),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.uint16: np.dtype(np.uint16),
    torch.uint32: np.dtype(np.uint32),
    torch.uint64: np.dtype(np.uint64),
    torch.float16: np.dtype(np.float16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
    torch.bfloat16: np.dtype(np.int16),
    torch.float8_e4m3fn: np.dtype(np.uint8),
    torch.float8_e5m2: np.dtype(np.uint8),
}

SHAPES = array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


def roundtrip(payload: dict[str, Any]) -> dict[str, Any]:
    """Encode, pass the document through JSON as a database would, and decode."""
    doc, blob = encode_payload(payload)
    text = json.dumps(doc, allow_nan=False)
    return decode_payload(json.loads(text), blob, row_id=ROW)


def tensor_bytes(t: torch.Tensor) -> bytes:
    if t.numel() == 0:  # torch refuses to view an empty tensor as bytes
        return b""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@st.composite
def numeric_arrays(draw: st.DrawFn) -> np.ndarray[Any, Any]:
    """Arrays of every supported dtype; float arrays also as raw bits (NaN payloads, -0.0)."""
    dtype = draw(st.sampled_from(NUMPY_DTYPES))
    shape = draw(SHAPES)
    if dtype.kind in "fc" and draw(st.booleans()):
        n = math.prod(shape) * dtype.itemsize
        raw = draw(st.binary(min_size=n, max_size=n))
        return np.frombuffer(raw, dtype).reshape(shape).copy()
    return draw(arrays(dtype, shape))


@st.composite
def torch_tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from(list(TORCH_DTYPES)))
    source = TORCH_DTYPES[dtype]
    shape = draw(SHAPES)
    if source.kind in "iu" and dtype.is_floating_point:  # bfloat16, float8: random bits
        n = math.prod(shape) * source.itemsize
        raw = draw(st.binary(min_size=n, max_size=n))
        array = np.frombuffer(raw, source).reshape(shape).copy()
    else:
        array = draw(arrays(source, shape))
    tensor = torch.from_numpy(array)
    return tensor.view(dtype) if tensor.dtype != dtype else tensor


# ---------------------------------------------------------------------------------------
# Round trips


@settings(max_examples=200, deadline=None)
@given(numeric_arrays())
def test_numpy_arrays_round_trip_bit_for_bit(array: np.ndarray[Any, Any]) -> None:
    out = roundtrip({"state": {"obs": array}})["state"]["obs"]
    assert type(out) is np.ndarray
    assert out.dtype == array.dtype
    assert out.shape == array.shape
    assert out.tobytes() == array.tobytes()
    assert out.flags.writeable
    assert deep_equal(out, array)


@settings(max_examples=200, deadline=None)
@given(torch_tensors())
def test_torch_tensors_round_trip_bit_for_bit(tensor: torch.Tensor) -> None:
    out = roundtrip({"actions": [tensor]})["actions"][0]
    assert isinstance(out, torch.Tensor)
    assert out.dtype == tensor.dtype
    assert out.shape == tensor.shape
    assert out.device.type == "cpu"
    assert tensor_bytes(out) == tensor_bytes(tensor)
    assert deep_equal(out, tensor)


def test_decoded_arrays_are_writable_and_aligned_and_give_no_torch_warning() -> None:
    payload = {
        "state": [np.arange(3, dtype=np.int8), np.ones((2, 2)), torch.arange(5)],
        "next_state": b"xyz",
    }
    doc, blob = encode_payload(payload)
    offsets = [doc["state"][i]["__tensor__"]["offset"] for i in range(3)]
    assert all(offset % 8 == 0 for offset in offsets)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = decode_payload(doc, blob, row_id=ROW)
        out["state"][1][0, 0] = 7.0
        out["state"][2][0] = 9
    assert out["state"][1][0, 0] == 7.0
    assert out["state"][0].tolist() == [0, 1, 2]  # neighbours are untouched
    assert out["next_state"] == b"xyz"


def test_numpy_scalars_come_back_as_numpy_scalars_of_the_same_type() -> None:
    scalars = [
        np.float32(1.5),
        np.float16(-0.0),
        np.int64(-(2**63)),
        np.uint64(2**64 - 1),
        np.bool_(True),
        np.complex64(1 - 2j),
        np.longdouble("1.1"),
    ]
    out = roundtrip({"state": scalars})["state"]
    for before, after in zip(scalars, out, strict=True):
        assert type(after) is type(before)
        assert np.asarray(after).tobytes() == np.asarray(before).tobytes()


def test_non_contiguous_and_big_endian_arrays_round_trip_by_value() -> None:
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    big = np.array([1.5, -0.0, np.nan, np.inf], dtype=">f8")
    out = roundtrip({"state": {"strided": base[::2], "t": base.T, "big": big}})["state"]
    assert np.array_equal(out["strided"], base[::2])
    assert np.array_equal(out["t"], base.T)
    assert out["big"].dtype == np.dtype("<f8")
    assert out["big"].tobytes() == big.astype("<f8").tobytes()
    assert deep_equal(out["big"], big)


def test_torch_tensor_requiring_grad_or_non_contiguous_comes_back_detached_on_cpu() -> None:
    grad = torch.linspace(-1, 1, 6, requires_grad=True)
    strided = torch.arange(12, dtype=torch.float32).reshape(3, 4).T
    conj = torch.tensor([1 + 2j, -3j], dtype=torch.complex64).conj()
    out = roundtrip({"actions": {"grad": grad, "strided": strided, "conj": conj}})["actions"]
    assert not out["grad"].requires_grad
    assert torch.equal(out["grad"], grad.detach())
    assert torch.equal(out["strided"], strided)
    assert torch.equal(out["conj"], conj.resolve_conj())


class Point(BaseModel):
    x: float
    y: float


class Color(enum.Enum):
    RED = "red"


class Rich(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    point: Point
    when: datetime.datetime
    ident: uuid.UUID
    color: Color
    tags: set[str]
    by_id: dict[int, str]
    obs: np.ndarray[Any, Any]


def test_nested_payload_with_models_tensors_and_reserved_keys_round_trips() -> None:
    rich = Rich(
        point=Point(x=1, y=float("inf")),
        when=datetime.datetime(2024, 5, 1, 12, 30),
        ident=uuid.UUID(int=7),
        color=Color.RED,
        tags={"b"},
        by_id={1: "one"},
        obs=np.eye(2, dtype=np.float32),
    )
    payload = {
        "state": {"url": "https://x", "step": 3, "big": 2**80, "obs": [np.arange(3), None]},
        "actions": [{"name": "click", "args": (1, 2)}, torch.zeros(2, 2)],
        "messages": [{"role": "user", "content": "hi"}],
        "next_state": {"r": float("nan"), "lo": float("-inf"), "neg": -0.0, "b": b"\x00\x01"},
        "ext_info": {
            "__tensor__": {"kind": "numpy"},
            "inner": {"__float__": "nan", "__escaped__": [1]},
            "model": rich,
            "point": Point(x=0.5, y=2),
            "scalar": np.float32(2.5),
        },
    }
    out = roundtrip(payload)
    expected = to_plain(payload)
    expected["actions"][0]["args"] = [1, 2]  # tuples come back as lists
    expected["ext_info"]["model"].update(
        when="2024-05-01T12:30:00",
        ident=str(uuid.UUID(int=7)),
        color="red",
        tags=["b"],
        by_id={"1": "one"},
    )
    assert deep_equal(out, expected)
    assert out["ext_info"]["__tensor__"] == {"kind": "numpy"}
    assert out["ext_info"]["point"] == {"x": 0.5, "y": 2.0}
    assert math.copysign(1, out["next_state"]["neg"]) == -1


def test_plain_json_data_is_kept_as_is_in_the_document() -> None:
    payload = {"state": {"url": "https://x", "depth": [1, 2.5, {"k": None, "t": True}]}}
    doc, blob = encode_payload(payload)
    assert doc == payload
    assert blob is None
    assert decode_payload(doc, None, row_id=ROW) == payload


def test_encoding_does_not_mutate_the_payload() -> None:
    inner = {"__float__": 1, "x": [float("nan")]}
    payload = {"state": inner}
    encode_payload(payload)
    assert payload == {"state": inner} and list(inner) == ["__float__", "x"]


json_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=5)
    | st.binary(max_size=5)
    | arrays(st.sampled_from(NUMPY_DTYPES), array_shapes(min_dims=0, max_dims=2, max_side=3))
    | st.builds(np.float32, st.floats(width=32))
    | st.builds(torch.tensor, st.lists(st.floats(width=32), max_size=3))
)
dict_keys = st.sampled_from(["__tensor__", "__float__", "__escaped__", "a", "__x__"]) | st.text()
nested = st.recursive(
    json_leaves,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(dict_keys, children, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(["state", "actions", "ext_info"]), nested))
def test_arbitrary_nested_payloads_round_trip(payload: dict[str, Any]) -> None:
    assert deep_equal(roundtrip(payload), payload)


# ---------------------------------------------------------------------------------------
# Damaged rows


def stored_row() -> tuple[dict[str, Any], bytes]:
    doc, blob = encode_payload({"state": {"obs": [np.arange(4.0), np.arange(3, dtype=np.int8)]}})
    assert blob is not None
    return doc, blob


def with_crc(payload: bytes) -> bytes:
    return b"XST1" + struct.pack("<I", zlib.crc32(payload)) + payload


def decode_fails(doc: dict[str, Any], blob: bytes | None, *words: str) -> str:
    with pytest.raises(CodecError) as info:
        decode_payload(doc, blob, row_id=ROW)
    message = str(info.value)
    assert f"row {ROW}" in message
    for word in words:
        assert word in message
    return message


def test_truncated_blob_is_reported_with_the_row_id() -> None:
    doc, blob = stored_row()
    decode_fails(doc, blob[:-3], "checksum", "delete and re-store the row")
    decode_fails(doc, blob[:5], "shorter than its header")


def test_truncated_blob_with_a_valid_checksum_fails_the_bounds_check() -> None:
    doc, blob = stored_row()
    decode_fails(doc, with_crc(blob[8:-2]), "state.obs[1]", "damaged or truncated")


def test_wrong_magic_is_reported() -> None:
    doc, blob = stored_row()
    decode_fails(doc, b"XXXX" + blob[4:], "expected b'XST2'")


def test_a_blob_is_tied_to_its_row() -> None:
    doc, blob = encode_payload({"state": np.arange(4.0)}, ROW)
    assert blob is not None and blob[:4] == b"XST2"
    assert decode_payload(doc, blob, row_id=ROW)["state"].tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(CodecError, match="copied from another row"):
        decode_payload(doc, blob, row_id="another-row")


def test_blobs_written_before_revision_0005_are_still_read() -> None:
    doc, blob = encode_payload({"state": np.arange(4.0)})  # no row: the XST1 header
    assert blob is not None and blob[:4] == b"XST1"
    assert decode_payload(doc, blob, row_id="any")["state"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_flipped_byte_fails_the_checksum() -> None:
    doc, blob = stored_row()
    damaged = bytearray(blob)
    damaged[12] ^= 0x01
    decode_fails(doc, bytes(damaged), "checksum")


def test_placeholder_pointing_out_of_bounds_is_reported() -> None:
    doc, blob = stored_row()
    doc["state"]["obs"][0]["__tensor__"]["offset"] = 10**6
    decode_fails(doc, blob, "state.obs[0]", "damaged or truncated")


def test_nbytes_not_matching_shape_and_dtype_is_reported() -> None:
    doc, blob = stored_row()
    doc["state"]["obs"][0]["__tensor__"]["nbytes"] = 8
    decode_fails(doc, blob, "state.obs[0]", "records 8 bytes")


@pytest.mark.parametrize("dtype", ["O", "|O8", "<U5", "|S3", "<M8[ns]", "V8", ">f8", "float64"])
def test_dtype_outside_the_whitelist_is_refused(dtype: str) -> None:
    doc, blob = stored_row()
    doc["state"]["obs"][0]["__tensor__"]["dtype"] = dtype
    decode_fails(doc, blob, "state.obs[0]", repr(dtype))


def test_unknown_torch_dtype_name_is_refused() -> None:
    doc, blob = encode_payload({"actions": torch.ones(2)})
    doc["actions"]["__tensor__"]["dtype"] = "__import__('os')"
    decode_fails(doc, blob, "not a known dtype")


@pytest.mark.parametrize(
    "placeholder",
    [
        {"__tensor__": {"kind": "numpy", "dtype": "<f8", "shape": [4], "offset": 0}},
        {"__tensor__": {"kind": "numpy", "dtype": "<f8", "shape": [-4], "offset": 0, "nbytes": 0}},
        {
            "__tensor__": {
                "kind": "numpy",
                "dtype": "<f8",
                "shape": [4],
                "offset": "0",
                "nbytes": 32,
            }
        },
        {"__tensor__": {"kind": "pickle", "dtype": "<f8", "shape": [4], "offset": 0, "nbytes": 32}},
        {
            "__tensor__": {
                "kind": "npscalar",
                "dtype": "<f8",
                "shape": [4],
                "offset": 0,
                "nbytes": 32,
            }
        },
        {"__tensor__": [1, 2]},
        {"__float__": "1e400"},
        {"__escaped__": [1]},
        {"__float__": "nan", "extra": 1},
    ],
)
def test_malformed_placeholder_is_reported(placeholder: dict[str, Any]) -> None:
    _, blob = stored_row()
    decode_fails({"state": {"x": [placeholder]}}, blob, "state.x[0]")


def test_tensor_placeholder_without_blob_is_reported() -> None:
    doc, _ = stored_row()
    decode_fails(doc, None, "no blob")


def test_document_that_is_not_an_object_is_reported() -> None:
    decode_fails([1, 2], None)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------
# Values that cannot be stored


class Opaque:
    pass


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (np.array([1, "a"], dtype=object), ["pickle", "convert to a numeric dtype or a list"]),
        (np.array(["a", "b"]), ["string arrays", ".tolist()"]),
        (np.array(["2024-01-01"], dtype="M8[D]"), ["datetime arrays"]),
        (np.zeros(2, dtype=[("a", "i4")]), ["structured arrays"]),
        ({1, 2}, ["set", "accepted types are", "list"]),
        (Opaque(), ["Opaque", "accepted types are"]),
        (1 + 2j, ["complex"]),
        (datetime.date(2024, 1, 1), ["datetime.date"]),
        ({1: "a"}, ["dict keys must be str", "1"]),
        (torch.eye(2).to_sparse(), ["sparse", "to_dense"]),
    ],
)
def test_unsupported_values_are_refused_naming_the_path(value: Any, words: list[str]) -> None:
    payload = {"state": {"obs": [0, 1, value]}}
    with pytest.raises(CodecError) as info:
        encode_payload(payload)
    with pytest.raises(ValueError) as check_info:
        check_value(payload["state"], "state")
    for message in (str(info.value), str(check_info.value)):
        assert "state.obs[2]" in message
        for word in words:
            assert word in message


def test_check_value_accepts_everything_encode_accepts() -> None:
    value = {
        "a": [None, True, 1, 2.5, "s", b"b", (1,), np.zeros(2), np.int8(1), torch.ones(1)],
        "m": Point(x=1, y=2),
    }
    check_value(value, "state")


def test_self_referencing_payload_is_refused() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(CodecError, match="nested too deeply or contains itself"):
        encode_payload({"state": loop})


# ---------------------------------------------------------------------------------------
# deep_equal and to_plain


def test_deep_equal_compares_arrays_bitwise() -> None:
    nan = np.array([np.nan, 1.0])
    assert deep_equal(nan, nan.copy())
    assert not deep_equal(np.array([-0.0]), np.array([0.0]))
    assert not deep_equal(np.zeros(2, np.float32), np.zeros(2, np.float64))
    assert not deep_equal(np.zeros((2, 1)), np.zeros(2))
    assert deep_equal(np.arange(3.0, dtype=">f8"), np.arange(3.0))


def test_deep_equal_separates_numpy_from_torch() -> None:
    assert not deep_equal(np.zeros(2, np.float32), torch.zeros(2))
    assert not deep_equal(torch.zeros(2), torch.zeros(2, dtype=torch.float64))
    assert deep_equal(torch.tensor([float("nan")]), torch.tensor([float("nan")]))
    assert not deep_equal(np.float32(1), 1.0)


def test_deep_equal_walks_containers_and_models() -> None:
    assert deep_equal({"a": [np.ones(1), float("nan")]}, {"a": [np.ones(1), float("nan")]})
    assert not deep_equal({"a": [np.ones(1)]}, {"a": [np.zeros(1)]})
    assert not deep_equal({"a": 1}, {"a": 1, "b": 2})
    assert not deep_equal([1, 2], [1])
    assert deep_equal(Point(x=1, y=2), Point(x=1, y=2))
    assert not deep_equal(Point(x=1, y=2), {"x": 1.0, "y": 2.0})


def test_to_plain_dumps_models_and_keeps_arrays() -> None:
    array = np.ones(2)
    plain = to_plain({"p": [Point(x=1, y=2)], "a": array, "t": (Point(x=0, y=0),)})
    assert plain["p"] == [{"x": 1.0, "y": 2.0}]
    assert plain["a"] is array
    assert plain["t"] == ({"x": 0.0, "y": 0.0},)


# ---------------------------------------------------------------------------------------
# No pickle, no eager torch


def test_round_trip_never_touches_pickle(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("pickle was used")

    for name in ("dump", "dumps", "load", "loads", "Pickler", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    payload = {"state": [np.arange(3.0), np.float32(1), torch.ones(2, dtype=torch.bfloat16)]}
    assert deep_equal(roundtrip(payload), payload)
    doc, blob = encode_payload({"state": np.arange(2)})
    doc["state"]["__tensor__"]["dtype"] = "|O8"
    decode_fails(doc, blob, "not a numeric dtype")


def test_importing_the_codec_and_decoding_numpy_does_not_import_torch() -> None:
    script = (
        "import sys, numpy as np\n"
        "from expstore.codec import encode_payload, decode_payload\n"
        "doc, blob = encode_payload({'s': np.arange(3)})\n"
        "decode_payload(doc, blob, row_id='r')\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


# --- PayloadWriter: the fast path gives exactly what the full walk gives -------------------


class _Model(BaseModel):
    name: str = "m"
    values: list[float] = [1.0, float("nan")]


_keys = st.sampled_from(["a", "b", "__tensor__", "__float__", "__x", "url", "é"])
_leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(["", "__init__", 'say "hi"', "\u2603", "__tensor__"])
    | st.builds(lambda n: np.arange(n, dtype=np.float32), st.integers(0, 4))
    | st.builds(lambda b: bytes(b), st.binary(max_size=4))
    | st.just(_Model())
    | st.builds(np.float16, st.floats(-10, 10))
)
_values = st.recursive(
    _leaves,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(_keys, inner, max_size=3)
        | st.tuples(inner, inner)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["state", "actions", "ext_info"]), _values))
def test_payload_writer_matches_the_full_walk(payload: dict[str, Any]) -> None:
    doc, blob = encode_payload(payload)
    assert PayloadWriter().encode(payload) == (dump_document(doc), blob)


def test_payload_writer_raises_what_the_full_walk_raises() -> None:
    with pytest.raises(CodecError, match=r"state\.x\[1\]: cannot store a value of type set"):
        PayloadWriter().encode({"state": {"x": [1, {2}]}})


@pytest.mark.parametrize(
    "state",
    [{"a": "x\ud800"}, {"k\udfff": 1}, ["ok", {"deep": ["é\udc80"]}]],
    ids=["value", "key", "nested"],
)
def test_a_lone_surrogate_is_refused_where_the_row_is_built(state: object) -> None:
    from pydantic import ValidationError

    from expstore import Experience

    with pytest.raises(
        ValidationError, match=r"state\S*: (a dict key .*: )?strings cannot hold lone surrogates"
    ):
        Experience(state=state)


def test_text_that_only_looks_unusual_is_storable(tmp_path) -> None:
    from expstore import ReplayBuffer
    from tests.helpers import make_row

    row = make_row(state={"é\U0001f600": "日本語 \u2028 \ufffd"})
    with ReplayBuffer(f"sqlite:///{tmp_path / 'x.db'}") as buf:
        buf.store(row)
        assert list(buf.query()) == [row]


def test_a_lone_surrogate_that_validation_cannot_see_fails_the_write_clearly(tmp_path) -> None:
    """A numpy string holds one: the write says what is wrong and stores nothing."""
    from expstore import CodecError, ReplayBuffer
    from tests.helpers import make_row

    with ReplayBuffer(f"sqlite:///{tmp_path / 'x.db'}") as buf:
        buf.store(make_row("kept"))
        with pytest.raises(
            CodecError, match=r"holds '\\udc80', which is not Unicode text.*Nothing was stored"
        ):
            buf.store_batch([make_row("a"), make_row("b", state={"s": np.str_("x\udc80")})])
        assert [r.exp_meta.task_id for r in buf.query()] == ["kept"]
