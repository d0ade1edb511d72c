"""The errors expstore raises.

Every error is an :class:`ExpstoreError`, so ``except ExpstoreError`` catches them all::

    ExpstoreError
    ├── CodecError          a value cannot be encoded, or a stored blob is damaged
    ├── SchemaVersionError  the database schema is older or newer than this library
    ├── StorageError        the database refused or failed an operation
    ├── QueryError          a malformed query condition (also a ValueError)
    ├── EmptyBufferError    nothing matches what a sampler was asked for (also a ValueError)
    └── MissingDependencyError  an optional extra (torch, postgres, parquet) is not installed

Invalid rows raise pydantic's ``ValidationError``, which names the field.
Every message says what was expected, what arrived, and what to do.
"""

from __future__ import annotations

__all__ = [
    "CodecError",
    "EmptyBufferError",
    "ExpstoreError",
    "MissingDependencyError",
    "QueryError",
    "SchemaVersionError",
    "StorageError",
]


class ExpstoreError(Exception):
    """The root of every error expstore raises."""


class CodecError(ExpstoreError):
    """A value cannot be encoded for storage, or a stored blob cannot be decoded."""


class SchemaVersionError(ExpstoreError):
    """The database schema revision does not match the one this library expects."""


class StorageError(ExpstoreError):
    """The database refused or failed a storage operation."""


class QueryError(ExpstoreError, ValueError):
    """A query condition is malformed or names an unknown field."""


class EmptyBufferError(ExpstoreError, ValueError):
    """A sampler found no rows matching its condition."""


class MissingDependencyError(ExpstoreError, ImportError):
    """An optional dependency is needed but not installed."""
