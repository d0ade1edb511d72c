"""docs/format.md is true: a Parquet export's rows decode by hand as the page says, and
through ``expstore.codec.decode_document``, bit for bit."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from expstore import CodecError, ReplayBuffer, export_rows
from tests.helpers import make_row

pq = pytest.importorskip("pyarrow.parquet")


def _exported(tmp_path: Path) -> tuple[dict, dict]:
    obs = np.array([[1.5, -0.0], [np.nan, 3e-45]], dtype=np.float32)
    mask = torch.tensor([1.0, -2.5, 3.0], dtype=torch.bfloat16)
    with ReplayBuffer(f"sqlite:///{tmp_path / 'f.db'}") as buffer:
        buffer.store(make_row("t", "a", 0, state={"obs": obs, "mask": mask, "url": "x"}))
        path = tmp_path / "rows.parquet"
        export_rows(buffer, path)
    table = pq.read_table(path).to_pylist()
    return table[0], {"obs": obs, "mask": mask}


def test_a_tensor_decodes_by_hand_as_docs_format_md_says(tmp_path: Path) -> None:
    row, original = _exported(tmp_path)
    doc, blob, row_id = json.loads(row["data"]), row["tensors"], row["id"]
    assert blob[:4] == b"XST2"
    assert int.from_bytes(blob[4:8], "little") == zlib.crc32(blob[8:], zlib.crc32(row_id.encode()))
    spec = doc["state"]["obs"]["__tensor__"]
    raw = np.frombuffer(blob, dtype=np.uint8, count=spec["nbytes"], offset=8 + spec["offset"])
    obs = raw.view(spec["dtype"]).reshape(spec["shape"])
    assert obs.tobytes() == original["obs"].tobytes()  # every bit, NaN and -0.0 included
    mask = doc["state"]["mask"]["__tensor__"]
    assert (mask["kind"], mask["dtype"]) == ("torch", "bfloat16")  # stored as <i2 bits
    bits = np.frombuffer(blob, dtype="<i2", count=3, offset=8 + mask["offset"])
    assert torch.equal(torch.from_numpy(bits.copy()).view(torch.bfloat16), original["mask"])


def test_decode_document_rebuilds_the_payload(tmp_path: Path) -> None:
    from expstore.codec import decode_document

    row, original = _exported(tmp_path)
    payload = decode_document(row["data"], row["tensors"], row["id"])
    assert payload["state"]["obs"].tobytes() == original["obs"].tobytes()
    assert payload["state"]["mask"].dtype == torch.bfloat16
    assert torch.equal(payload["state"]["mask"], original["mask"])
    assert payload["state"]["url"] == "x"
    with pytest.raises(CodecError, match="row other"):
        decode_document(row["data"], row["tensors"], "other")  # the checksum covers the id
    with pytest.raises(CodecError, match="not JSON"):
        decode_document("{oops", row["tensors"], row["id"])
