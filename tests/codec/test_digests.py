"""The array digest: the one formula content addressing and changed() rely on."""

from __future__ import annotations

import hashlib

import numpy as np

from expstore.codec.digests import array_digest


def test_digest_is_blake2b_of_dtype_shape_and_bytes() -> None:
    array = np.arange(6, dtype="<f4").reshape(2, 3)
    expected = hashlib.blake2b(b"<f4|2,3|" + array.tobytes(), digest_size=16).hexdigest()
    assert array_digest(array) == expected
    assert len(expected) == 32


def test_digest_tells_dtype_and_shape_apart_and_ignores_memory_layout() -> None:
    array = np.arange(12, dtype=np.int32).reshape(3, 4)
    assert array_digest(array) != array_digest(array.reshape(4, 3))
    assert array_digest(array) != array_digest(array.view(np.float32))
    strided = np.arange(24, dtype=np.int32).reshape(3, 8)[:, ::2]
    assert array_digest(strided) == array_digest(np.ascontiguousarray(strided))
