"""The errors expstore raises.

Every error expstore raises on purpose is an :class:`ExpstoreError`, so ``except
ExpstoreError`` catches them all; where Python code expects a built-in kind (``ValueError``
for a bad value, ``TypeError`` for a wrong type, ``IndexError`` out of range, ``ImportError``
for a missing package, pydantic's ``ValidationError`` for an invalid row) the error is that
too::

    ExpstoreError
    ├── InvalidArgumentError      an argument has a value expstore cannot use (ValueError)
    │   ├── RetentionConflictError    a handle asks for another capacity/eviction than the
    │   │                             buffer keeps
    │   └── PolicyVersionError        a policy version going backwards without force=True
    ├── UnsupportedTypeError      an argument or value of a type expstore cannot use (TypeError)
    ├── OutOfRangeError           an index beyond the rows there are (IndexError)
    ├── RowValidationError        a row holds an invalid value (pydantic's ValidationError)
    ├── CodecError                a value cannot be encoded, or a stored blob is damaged
    │   │                         (ValueError)
    │   └── CorruptRowError           a stored row's bytes (its blob, or an array it refers
    │                                 to) are damaged, cut, inflated or missing
    ├── QueryError                a malformed condition or field path (ValueError)
    ├── EmptyBufferError          nothing matches what a sampler was asked for (ValueError)
    ├── SchemaVersionError        the database schema is older or newer than this library
    ├── StorageError              the database refused or failed an operation
    │   ├── DuplicateIdError          a row id is already stored, or given twice (ValueError)
    │   ├── DuplicateContentError     with dedup="error": a row's content is already stored
    │                                 (ValueError)
    │   ├── ReplicaError              a read URL is not a usable replica of the primary
    │   └── ConnectionLostError       the connection went away in the middle of a read
    │                                 (the sampling loop retries it)
    ├── ClaimError                a claim cannot be acked, released or renewed as asked
    │   ├── LeaseExpiredError         its lease ran out and another consumer claimed rows
    │   ├── ClaimOwnerError           it belongs to another consumer
    │   ├── ClaimFinishedError        it was already acked or released
    │   ├── FencedError               a newer incarnation of its consumer opened
    │   │                             (buffer.consumer(name)): an older one changes nothing
    │   └── RowsEvictedError          rows of it were evicted (or deleted) before its ack
    ├── UnknownConsumerError      no checkpoint stored for that consumer (LookupError)
    ├── WaitTimeoutError          the data waited for did not come in time (TimeoutError)
    │   ├── RateLimitedError          a rate limit kept a sample or a write waiting too long
    │   └── AdmissionTimeoutError     a prompt queue's admission bound kept a claim waiting
    │                                 too long (held_by: "staleness" or "backlog")
    └── MissingDependencyError    an optional extra (torch, postgres, parquet) is not
                                  installed (ImportError)

Rows built with invalid values raise pydantic's ``ValidationError`` as pydantic raises it;
a row changed after it was built is checked again when it is stored, and refused with a
:class:`RowValidationError`, which is a ``ValidationError`` naming the field and the row.
Every message says what was expected, what arrived, and what to do.
"""

from __future__ import annotations

from pydantic import ValidationError

__all__ = [
    "AdmissionTimeoutError",
    "ClaimError",
    "ClaimFinishedError",
    "ClaimOwnerError",
    "CodecError",
    "ConnectionLostError",
    "CorruptRowError",
    "DuplicateContentError",
    "DuplicateIdError",
    "EmptyBufferError",
    "ExpstoreError",
    "FencedError",
    "InvalidArgumentError",
    "LeaseExpiredError",
    "MissingDependencyError",
    "OutOfRangeError",
    "PolicyVersionError",
    "QueryError",
    "RateLimitedError",
    "ReplicaError",
    "ReplicaWarning",
    "RetentionConflictError",
    "RowValidationError",
    "RowsEvictedError",
    "SchemaVersionError",
    "StorageError",
    "UnknownConsumerError",
    "UnsupportedTypeError",
    "WaitTimeoutError",
]


class ExpstoreError(Exception):
    """The root of every error expstore raises."""


class InvalidArgumentError(ExpstoreError, ValueError):
    """An argument has a value expstore cannot use."""


class RetentionConflictError(InvalidArgumentError):
    """A handle asks for another capacity or eviction policy than the buffer keeps."""


class PolicyVersionError(InvalidArgumentError):
    """A policy version lower than the buffer's current one, without ``force=True``."""


class UnsupportedTypeError(ExpstoreError, TypeError):
    """An argument or value is of a type expstore cannot use there."""


class OutOfRangeError(ExpstoreError, IndexError):
    """An index points beyond the rows there are."""


class RowValidationError(ExpstoreError, ValidationError):
    """A row holds a value its model does not allow (it was changed after it was built)."""


class CodecError(ExpstoreError, ValueError):
    """A value cannot be encoded for storage, or a stored blob cannot be decoded."""


class CorruptRowError(CodecError):
    """A stored row's bytes are damaged, cut, inflated or missing: that row cannot be read
    (the rest of the buffer can)."""


class SchemaVersionError(ExpstoreError):
    """The database schema revision does not match the one this library expects."""


class StorageError(ExpstoreError):
    """The database refused or failed a storage operation."""


class DuplicateIdError(StorageError, ValueError):
    """A row id is already stored in the buffer, or appears twice in one batch."""


class DuplicateContentError(StorageError, ValueError):
    """With ``dedup="error"``: a row's content is already stored in the buffer, or repeated
    in the batch."""


class QueryError(ExpstoreError, ValueError):
    """A query condition or field path is malformed or names an unknown field."""


class EmptyBufferError(ExpstoreError, ValueError):
    """A sampler found no rows matching its condition."""


class MissingDependencyError(ExpstoreError, ImportError):
    """An optional dependency is needed but not installed."""


class ClaimError(ExpstoreError):
    """A claim cannot be made, acked, released or renewed as asked; nothing was changed."""


class LeaseExpiredError(ClaimError):
    """The claim's lease ran out and another consumer has claimed some of its rows since."""


class ClaimOwnerError(ClaimError):
    """The claim belongs to another consumer than the one acking or releasing it."""


class ClaimFinishedError(ClaimError):
    """The claim was already acked or released."""


class FencedError(ClaimError):
    """A claim, ack, release, renewal or checkpoint of a consumer's older incarnation (or
    one without an generation, of a consumer opened with generations): refused, nothing changed."""


class RowsEvictedError(ClaimError):
    """Rows of the claim were evicted (or deleted) before its ack; nothing was changed.

    ``evicted`` is how many, ``reasons`` how many went by each reason (``capacity``,
    ``stale``, ``delete``, ``clear``; ``unknown`` for rows whose tombstone is no longer
    kept)."""

    def __init__(self, message: str, evicted: int = 0, reasons: dict[str, int] | None = None):
        super().__init__(message)
        self.evicted = evicted
        self.reasons = dict(reasons or {})


class UnknownConsumerError(ExpstoreError, LookupError):
    """No checkpoint is stored for that consumer in this buffer."""


class WaitTimeoutError(ExpstoreError, TimeoutError):
    """What was waited for did not happen before the timeout."""


class RateLimitedError(WaitTimeoutError):
    """The buffer's rate limit kept a sample (or a write) waiting past its timeout."""


class AdmissionTimeoutError(WaitTimeoutError):
    """A claim of prompts waited past its timeout for room under the prompt queue's
    admission bound. ``held_by`` names the bound (``"staleness"`` or ``"backlog"``);
    ``in_flight`` and ``backlog`` are the counts it last saw."""

    def __init__(self, message: str, held_by: str, in_flight: int, backlog: int) -> None:
        super().__init__(message)
        self.held_by = held_by
        self.in_flight = in_flight
        self.backlog = backlog


class ReplicaError(StorageError):
    """A read URL is not a usable replica of the primary (a primary itself, a replica of
    another cluster, not Postgres)."""


class ConnectionLostError(StorageError):
    """The connection (to a replica or the primary) went away in the middle of a read,
    which changed nothing; the sampling loop retries it (on the next replica or the
    primary), other reads may simply be called again."""


class ReplicaWarning(UserWarning):
    """Reads left a replica for the primary (or the next replica): it is unreachable,
    lagging beyond ``max_lag_s``, or has not replayed this handle's last write in time."""
