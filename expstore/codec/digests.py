"""Array digests: one array's identity by its dtype, shape and bytes."""

from __future__ import annotations

import hashlib

import numpy

__all__ = ["array_digest"]


def array_digest(array: numpy.ndarray) -> str:
    """The digest of ``array``: BLAKE2b (16 bytes, 32 hex digits) of its dtype string, its
    shape and its bytes in C order, so two arrays have one digest exactly when they have the
    same dtype, shape and values (bit for bit)."""
    return hashlib.blake2b(
        f"{array.dtype.str}|{','.join(map(str, array.shape))}|".encode()
        + numpy.ascontiguousarray(array).tobytes(),
        digest_size=16,
    ).hexdigest()
