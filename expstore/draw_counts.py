"""Draw counts for samplers with ``consume_after=k``: how many times each row was drawn,
counted in the database across every process, so that a row leaves those samplers after
its k-th draw (TorchRL's consume-after-n-samples, for many processes).

One upsert counts a draw of each chosen row that has had fewer than k, and returns which;
the sampler leaves the others out from then on and chooses again for the places they
left. On Postgres the upsert's condition is evaluated on the newest committed count (a
concurrent counter's insert is waited for), so two processes never both take a row's last
draw.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sqlalchemy import ColumnElement, select

from .db.handle import BufferHandle, retried
from .db.schema import rows, sample_counts

__all__ = ["count_draws", "spent_keys", "times_sampled", "unspent_clause"]

_COUNT = sample_counts.c
#: foreign_key_violation: a counted row deleted by a transaction that committed meanwhile.
_GONE = frozenset({"23503"})


def count_draws(handle: BufferHandle, keys: np.ndarray, limit: int) -> np.ndarray:
    """Count one draw of each of ``keys`` (distinct) whose row has had fewer than ``limit``
    draws; returns those keys, in the order given. The others have had all their draws."""
    keys = np.asarray(keys, dtype=np.int64)
    if not len(keys):
        return keys
    dialect = handle.dialect
    values = {"buffer_id": handle.buffer_id, "times_sampled": 1}
    given = dialect.bound_keys()
    # Only rows still stored: a row evicted or deleted since it was chosen is not counted
    # (its count would refer to no row).
    stored = select(rows.c.key).where(rows.c.key == given.c.key).exists()
    insert = dialect.insert_per_key(sample_counts, values, given, stored)
    stmt = insert.on_conflict_do_update(
        index_elements=[_COUNT.key],
        set_={"times_sampled": _COUNT.times_sampled + 1},
        where=_COUNT.times_sampled < limit,
    ).returning(_COUNT.key)
    # In key order: processes counting overlapping draws then take the counts' row locks in
    # one order and never deadlock (drawn orders are random).
    ordered = np.sort(keys).tolist()

    def count() -> np.ndarray:
        with handle.errors("count draws"), handle.write() as conn:
            found = conn.execute(stmt, {"keys": dialect.key_set(ordered)}).scalars()
            return np.fromiter(found, np.int64)

    # A deadlock with a writer evicting these rows (its cascade waits for our counts, our
    # foreign-key checks for its deletes), or a row deleted between the check above and
    # the foreign key's: rolled back, so count again.
    counted = retried(count, _GONE)
    return keys[np.isin(keys, counted)]


def spent_keys(handle: BufferHandle, limit: int, among: np.ndarray | None = None) -> np.ndarray:
    """The keys of the buffer's rows drawn ``limit`` times or more, sorted: a read of the
    buffer's counts, for a key index about to be drawn from; of ``among`` alone if given
    (by their keys)."""
    spent = [_COUNT.buffer_id == handle.buffer_id, _COUNT.times_sampled >= limit]
    params = {}
    if among is not None:
        spent.append(handle.dialect.key_in(_COUNT.key))
        params["keys"] = handle.dialect.key_set(np.unique(among).tolist())
    with handle.errors("read draw counts"), handle.read() as conn:
        found = np.fromiter(
            conn.execute(select(_COUNT.key).where(*spent), params).scalars(), np.int64
        )
    return np.sort(found)


def unspent_clause(limit: int) -> ColumnElement[bool]:
    """Rows drawn fewer than ``limit`` times (never counted included), for a statement
    over the rows table: one primary-key lookup in the counts per row."""
    spent = select(_COUNT.key).where(_COUNT.key == rows.c.key, _COUNT.times_sampled >= limit)
    return ~spent.exists()


def times_sampled(handle: BufferHandle, keys: Sequence[int]) -> dict[int, int]:
    """How many counted draws each of ``keys`` has had (keys never counted left out)."""
    stmt = (
        sample_counts.select()
        .with_only_columns(_COUNT.key, _COUNT.times_sampled)
        .where(handle.dialect.key_in(_COUNT.key))
    )
    with handle.errors("read draw counts"), handle.read() as conn:
        found = conn.execute(stmt, {"keys": handle.dialect.key_set(list(keys))})
        return {int(k): int(n) for k, n in found}
