"""Deduplication: refuse or skip rows whose content is already stored in the buffer.

Every row is stored with a digest of its content (``content_hash``: everything but its id
and ``execute_time``, see :func:`expstore.storage.writer.content_hash`), indexed per buffer.
A write with ``dedup="skip"`` leaves out rows whose digest the buffer already holds (or
that repeat an earlier row of the same batch); ``dedup="error"`` stores nothing and raises
:class:`~expstore.errors.DuplicateContentError`. The check runs inside the write's
transaction after it took the buffer's row, which every writer of the buffer takes first,
so two processes writing the same rollout at once store it once: the second sees the
first's committed row. Rows stored before schema revision 0005 carry no digest and are
not compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from sqlalchemy import Connection, select

from .db.dialects import WRITE_COLUMNS
from .db.handle import BufferHandle
from .db.schema import rows
from .errors import DuplicateContentError, InvalidArgumentError

__all__ = ["Dedup", "DEDUP_MODES", "check_dedup", "without_duplicates"]

Dedup = Literal["skip", "error"] | None
DEDUP_MODES = ("skip", "error")
_HASH_AT = WRITE_COLUMNS.index("content_hash")
_ID_AT = WRITE_COLUMNS.index("id")
#: Digests looked up per statement.
_LOOKUP = 2000


def check_dedup(dedup: Any) -> Dedup:
    if dedup is not None and dedup not in DEDUP_MODES:
        raise InvalidArgumentError(
            f'dedup must be None, "skip" (leave out rows already stored) or "error" (store '
            f"nothing if any is), got {dedup!r}"
        )
    return dedup  # type: ignore[no-any-return]


def without_duplicates(
    handle: BufferHandle, conn: Connection, encoded: Sequence[tuple[Any, ...]], dedup: str
) -> list[tuple[Any, ...]]:
    """``encoded`` rows without those whose content the buffer holds or the batch repeats;
    with ``dedup="error"``, DuplicateContentError if there is any."""
    digests = [row[_HASH_AT] for row in encoded]
    stored: set[str] = set()
    unique = list(dict.fromkeys(digests))
    for start in range(0, len(unique), _LOOKUP):
        stmt = select(rows.c.content_hash).where(
            rows.c.buffer_id == handle.buffer_id,
            rows.c.content_hash.in_(unique[start : start + _LOOKUP]),
        )
        stored.update(conn.execute(stmt).scalars())
    kept: list[tuple[Any, ...]] = []
    seen: set[str] = set()
    repeated: list[str] = []
    for row in encoded:
        digest = row[_HASH_AT]
        if digest in stored or digest in seen:
            repeated.append(row[_ID_AT])
            continue
        seen.add(digest)
        kept.append(row)
    if repeated and dedup == "error":
        shown = ", ".join(repr(i) for i in repeated[:5])
        raise DuplicateContentError(
            f"{len(repeated)} of {len(encoded)} rows ({shown}) hold the same content as a row "
            f"already stored in buffer {handle.name!r} or earlier in the batch. Nothing was "
            'stored; pass dedup="skip" to store the others'
        )
    return kept
