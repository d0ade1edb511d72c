"""The digest of an array's content: what content addressing stores it by, what rows
refer to it by, and what ``changed(path)`` compares.

It covers the dtype (as its numpy string, byte order included), the shape and the bytes in
C order, so two arrays share a digest exactly when they are the same value.
"""

from __future__ import annotations

import hashlib

import numpy

__all__ = ["array_digest"]


def array_digest(array: numpy.ndarray) -> str:
    """The 32-hex-digit BLAKE2b-128 digest of ``array``'s dtype, shape and C-order bytes."""
    return hashlib.blake2b(
        f"{array.dtype.str}|{','.join(map(str, array.shape))}|".encode()
        + numpy.ascontiguousarray(array).tobytes(),
        digest_size=16,
    ).hexdigest()
