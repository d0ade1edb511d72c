"""What an ack does about the buffer's retention, in the ack's own transaction.

- **Rows evicted before the ack.** Capacity is exact, so a claim's rows can go beyond it
  while leased (and any row by ``delete()``, or a stale one whose lease ran out). The ack
  of such a claim raises :class:`~expstore.errors.RowsEvictedError`, saying how many went
  and why (from their tombstones, see :mod:`expstore.retention.tombstones`), and changes
  nothing: never a silent short count with the checkpoint stored. ``allow_evicted=True``
  acks the rows left and stores the checkpoint, knowingly.
- **Stale rows kept for the claim.** Eviction ``"stale"`` passes over rows under a live
  lease (see :mod:`expstore.retention.eviction`); once acked they are stale like any
  other, so the ack evicts them in its own transaction (tombstones recording the ack).
  Rows of a claim released, or whose lease ran out, go at the next write or version
  change instead.

On Postgres the ack takes turns with writers row by row: it takes a ``FOR KEY SHARE``
lock on its claim's rows before their entries (as claims lock rows before entries), and
with eviction ``"stale"`` the buffer's row before everything (as writers and training
steps do: the buffer's row, the consumer's, the rows, the entries), so an eviction and an
ack of the same row never interleave and never deadlock.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy import Connection, bindparam, select

from ..db.handle import BufferHandle
from ..db.schema import buffers, progress, ready_groups, rows
from ..errors import RowsEvictedError
from ..lifecycle.registry import buffer_row, bump_version, lock_buffer, remove
from ..retention.eviction import stale_rows
from ..retention.tombstones import reasons_of

__all__ = ["AckRetention"]


_CLEARED: dict[str, tuple[Any, Any]] = {}


def _cleared_by_ack(dialect: Any) -> tuple[Any, Any]:
    """Whether any of the bound ``keys`` has saved progress, and whether any is the first
    row of a group in the ready-group index: built once per backend."""
    found = _CLEARED.get(dialect.name)
    if found is None:
        saved = select(progress.c.key).where(dialect.key_in(progress.c.key)).exists()
        first = ready_groups.c.first_key
        grouped = select(first).where(dialect.key_in(first)).exists()
        found = _CLEARED[dialect.name] = (saved, grouped)
    return found


class AckRetention:
    """The retention side of one ack of the claim whose rows are ``keys``:
    :meth:`hold_buffer` before the consumer's row is locked, :meth:`hold_rows` before the
    claim's entries are, :meth:`settle` once they are acked."""

    def __init__(
        self, handle: BufferHandle, claim_id: str, keys: np.ndarray, allow_evicted: bool
    ) -> None:
        self._handle = handle
        self._claim_id = claim_id
        self._keys = sorted({int(k) for k in keys})
        self._allow_evicted = allow_evicted
        self._stale = False
        #: Whether the claim's rows have saved progress, and are first rows of groups in
        #: the ready-group index (read by :meth:`hold_buffer`): what the ack clears.
        self.saved = True
        self.grouped = True

    def _claimed(self) -> Any:
        # The values inline: a claim may hold more keys than a statement may bind.
        keys: Any = bindparam("claim_keys", self._keys, expanding=True, literal_execute=True)
        return rows.c.key.in_(keys)

    @property
    def stale(self) -> bool:
        """Whether the buffer's eviction is ``"stale"`` (as :meth:`take` last read it): the
        ack may evict, so it locks the buffer's row before anything else."""
        return self._stale

    def hold_buffer(self, conn: Connection) -> None:
        """Check the buffer is still the handle's; with eviction ``"stale"`` lock its row
        (the ack may evict), first, as writers take it."""
        handle = self._handle
        found = buffer_row(handle, conn, *self.columns(), params={"keys": self.handle_keys()})
        if self.take(found):
            lock_buffer(handle, conn)

    def columns(self) -> tuple[Any, ...]:
        """What :meth:`hold_buffer` reads of the buffer's row, as expressions (for one
        statement that reads them with others; its ``keys``: :meth:`handle_keys`): the
        eviction policy, whether the claim's rows have saved progress, whether any is the
        first row of a ready group."""
        return (buffers.c.eviction, *_cleared_by_ack(self._handle.dialect))

    def handle_keys(self) -> Any:
        """The claim's keys, bound as :meth:`columns` take them."""
        return self._handle.dialect.key_set(self._keys)

    def take(self, found: tuple[Any, ...]) -> bool:
        """Take the values :meth:`columns` read; returns whether the ack may evict (eviction
        ``"stale"``: then the buffer's row must be locked before anything else)."""
        policy, saved_, grouped_ = found
        self.saved, self.grouped = bool(saved_), bool(grouped_)
        self._stale = policy == "stale"
        return self._stale

    @property
    def keys(self) -> list[int]:
        """The claim's keys, sorted, each once."""
        return self._keys

    def hold_rows(self, conn: Connection) -> None:
        """Lock the claim's rows against deletion (Postgres), before their entries."""
        handle = self._handle
        if handle.dialect.locks_rows and self._keys:
            shared = handle.dialect.key_shared(
                select(rows.c.key).where(self._claimed()).order_by(rows.c.key)
            )
            conn.execute(shared).all()

    def settle(self, conn: Connection, acked: int) -> None:
        """After the claim's entries are acked (``acked`` of them: the rest went with
        their rows): RowsEvictedError if rows went, unless allowed; then evict the
        claim's rows that eviction ``"stale"`` kept for it."""
        handle = self._handle
        if acked < len(self._keys) and not self._allow_evicted:
            raise self._evicted_error(conn, acked)
        if self._stale and acked:
            where = [self._claimed(), stale_rows(handle.buffer_id)]
            if remove(handle, conn, where, "stale", "stale"):
                bump_version(handle, conn)

    def _evicted_error(self, conn: Connection, acked: int) -> RowsEvictedError:
        handle = self._handle
        stored = conn.execute(select(rows.c.key).where(self._claimed())).scalars()
        present = {int(k) for k in stored}
        gone = [k for k in self._keys if k not in present]
        found = reasons_of(handle, conn, gone)
        reasons: dict[str, int] = {}
        for (reason, _), n in found.items():
            reasons[reason] = reasons.get(reason, 0) + n
        by = ", ".join(_described(reason, policy, n) for (reason, policy), n in found.items())
        total = len(self._keys)
        left = total - len(gone)
        return RowsEvictedError(
            f"claim {self._claim_id}: {len(gone)} of its {total} rows left buffer "
            f"{handle.name!r} before this ack ({by}); nothing was changed (the checkpoint "
            f"was not stored, the {left} rows left are still leased). To ack the {left} "
            "rows left and store the checkpoint anyway, call ack(..., allow_evicted=True); "
            "or release() the claim and claim again. Capacity eviction takes leased rows "
            "too: give the buffer room for the rows learners hold "
            "(buffer.set_retention(capacity, ...)), or ack sooner",
            len(gone),
            reasons,
        )


def _described(reason: str, policy: str | None, n: int) -> str:
    if reason == "capacity":
        return f"{n} by capacity eviction (policy {policy!r})"
    if reason == "stale":
        return f"{n} as stale (eviction 'stale'; their lease had run out)"
    if reason in ("delete", "clear"):
        return f"{n} by {reason}()"
    return f"{n} with no tombstone left to say why (see set_retention(tombstones=))"
