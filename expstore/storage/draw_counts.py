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

from .handle import BufferHandle
from .schema import sample_counts

__all__ = ["count_draws", "times_sampled"]

_COUNT = sample_counts.c


def count_draws(handle: BufferHandle, keys: np.ndarray, limit: int) -> np.ndarray:
    """Count one draw of each of ``keys`` (distinct) whose row has had fewer than ``limit``
    draws; returns those keys, in the order given. The others have had all their draws."""
    keys = np.asarray(keys, dtype=np.int64)
    if not len(keys):
        return keys
    dialect = handle.dialect
    values = {"buffer_id": handle.buffer_id, "times_sampled": 1}
    insert = dialect.insert_per_key(sample_counts, values)
    stmt = insert.on_conflict_do_update(
        index_elements=[_COUNT.key],
        set_={"times_sampled": _COUNT.times_sampled + 1},
        where=_COUNT.times_sampled < limit,
    ).returning(_COUNT.key)
    with handle.errors("count draws"), handle.write() as conn:
        found = conn.execute(stmt, {"keys": dialect.key_set(keys.tolist())}).scalars()
        counted = np.fromiter(found, np.int64)
    return keys[np.isin(keys, counted)]


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
