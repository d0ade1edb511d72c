"""A buffer's rate limit in the database: its settings and the samples counted under it.

One row of ``expstore_rate_limits`` per limited buffer. Inserts are counted by writers in
``expstore_buffers.inserted``, on the buffer row every write locks anyway, so counting
costs writers no new lock. Samples are counted on the rate-limit row by one conditional
``UPDATE ... SET samples = samples + n WHERE <the budget allows n>``, a statement of its
own that commits at once (autocommit: one round trip). The row is locked only for that
statement, never across a sample's fetch, so samplers do not queue behind each other's
work (nor behind writers, whose transactions hold the buffer row, not this one), and the
budget is exact (concurrent updates of the row re-check the condition on the newest
count). On Postgres that commit does not wait for the log to reach disk
(``synchronous_commit`` off for it alone), so the row is held for microseconds, not for a
flush: a crash may forget the last counts, which only loosens the budget by what was
sampled just before it. Whether a buffer has a limit at all is read by the key index in
its freshness round trip, so unlimited buffers pay nothing per sample.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from sqlalchemy import Connection, case, delete, func, literal, select, update

from .._retry import RATE_LIMIT_WAIT, Waiting
from ..db.handle import BufferHandle
from ..db.schema import buffers, discard_counts, discarded_rows, rate_limits, rows
from ..errors import InvalidArgumentError, RateLimitedError
from ..lifecycle.hooks import RowFeature, WriteContext, register
from ..lifecycle.reader_state import limited_flag
from ..lifecycle.registry import lock_buffer
from .rate_limiter import RateLimiter, RateLimitStats
from .reservation import Reservation

__all__ = ["RateLimits", "WriteBlocked", "discard", "limited_flag"]

_R = rate_limits.c


class WriteBlocked(Exception):
    """Internal: a write must wait for samplers (rolled back, retried by the writer)."""


def discard(handle: BufferHandle, conn: Connection, n: int) -> None:
    """Count ``n`` rows of the buffer that were inserted but can never be drawn (a group
    the group condition refuses, rows gone stale before any draw), inside the caller's
    transaction, which holds the buffer's row (a write does; so must the caller).

    A rate limit counts a discarded row as never inserted: it no longer counts towards
    ``min_size`` (as Reverb's ``RateLimiter::Delete`` lowers the size) and no longer adds
    ``samples_per_insert`` samples of budget, so writers held by ``block_writers`` are not
    held waiting for samples that can never come. Count each row once, and only rows that
    no sampler or claim has drawn: a discard gives back the budget of a row that was never
    spent. Counted whether or not the buffer has a limit now (a limit set later counts
    from then), at the cost of one update of a row the transaction holds already."""
    if n:
        this = buffers.c.id == handle.buffer_id
        conn.execute(update(buffers).where(this).values(discarded=buffers.c.discarded + n))


def discard_once(handle: BufferHandle, conn: Connection, keys: Sequence[int]) -> int:
    """Count the rows of ``keys`` that can never be drawn (a group a group condition
    refuses, or stale: see :mod:`expstore.claims.ready_groups`) as discarded, each
    once whoever finds it again, inside the caller's transaction; returns how many were
    new. Unlike :func:`discard` it never touches the buffer's row: the rows are recorded in
    ``expstore_discarded`` and counted in the buffer's row of ``expstore_discard_counts``,
    so a claim that discards never waits for writers (nor they for it)."""
    if not len(keys):
        return 0
    dialect = handle.dialect
    new = (
        dialect.insert_per_key(discarded_rows, {"buffer_id": handle.buffer_id})
        .on_conflict_do_nothing(index_elements=[discarded_rows.c.key])
        .returning(discarded_rows.c.key)
    )
    n = len(conn.execute(new, {"keys": dialect.key_set(sorted({int(k) for k in keys}))}).all())
    if n:
        count = dialect.upsert(discard_counts).values(buffer_id=handle.buffer_id, rows=n)
        conn.execute(
            count.on_conflict_do_update(
                index_elements=[discard_counts.c.buffer_id],
                set_={"rows": discard_counts.c.rows + n},
            )
        )
    return n


def discarded_total(buffer_id: int) -> Any:
    """The rows of the buffer discarded ever (by :func:`discard` and :func:`discard_once`),
    as SQL over a statement that selects the buffer's row."""
    counted = select(discard_counts.c.rows).where(discard_counts.c.buffer_id == buffer_id)
    return buffers.c.discarded + func.coalesce(counted.scalar_subquery(), 0)


def _counted(buffer_id: int) -> Any:
    """Rows inserted under the limit, less those discarded under it: the buffer's counts
    less the limit's bases."""
    b = buffers.c
    net = select(b.inserted - discarded_total(buffer_id)).where(b.id == buffer_id).scalar_subquery()
    return net - (_R.inserted_base - _R.discarded_base)


def _since_limit(buffer_id: int, column: Any, base: Any) -> Any:
    """``column`` of the buffer's row, less ``base`` of the limit's (None: as it is)."""
    value = select(column).where(buffers.c.id == buffer_id).scalar_subquery()
    return value if base is None else value - base


class RateLimits:
    """The rate limit of one buffer, as one handle uses it."""

    def __init__(self, handle: BufferHandle) -> None:
        self.handle = handle
        #: (monotonic time, whether the buffer had a limit) as last seen by a key index read.
        self.seen: tuple[float, bool] | None = None
        #: Samples that had to wait, and seconds waited, by this handle.
        self.waits = 0
        self.waited_s = 0.0
        #: Per thread: the limit (its ``created_at``) this thread's last samples were
        #: counted under, which alone a refund gives back to.
        self._counted_under = threading.local()

    def observe(self, limited: bool) -> None:
        self.seen = (time.monotonic(), limited)

    # -- settings ------------------------------------------------------------------------
    def set(self, limiter: RateLimiter | None) -> None:
        """Limit the buffer with ``limiter`` (None: no limit) for every process. Setting the
        limit the buffer already has keeps its counters (a trainer that restarts and sets
        it again resumes its budget); another one starts counting from now."""
        handle = self.handle
        this = _R.buffer_id == handle.buffer_id
        if limiter is not None and not isinstance(limiter, RateLimiter):
            raise InvalidArgumentError(
                f"set_rate_limiter() takes a RateLimiter or None, got {type(limiter).__name__}"
            )
        with handle.errors("set the rate limit"), handle.write() as conn:
            inserted, discarded, capacity = lock_buffer(
                handle,
                conn,
                buffers.c.inserted,
                discarded_total(handle.buffer_id),
                buffers.c.capacity,
            )
            # Touch the buffer's row: a writer that waited on it reads the limit anew.
            mine = buffers.c.id == handle.buffer_id
            conn.execute(update(buffers).where(mine).values(version=buffers.c.version))
            self.observe(limiter is not None)  # (a hint this handle's claims check again)
            if limiter is None:
                conn.execute(delete(rate_limits).where(this))
                return
            if capacity is not None and limiter.min_size > capacity:
                raise InvalidArgumentError(
                    f"min_size={limiter.min_size} can never be met: the buffer keeps at most "
                    f"{capacity} rows. Lower min_size or raise the capacity"
                )
            stored = conn.execute(select(rate_limits).where(this)).first()
            wanted = limiter.settings()
            if stored is not None and {k: getattr(stored, k) for k in wanted} == wanted:
                return  # the same limit, as stored (not rebuilt from floats): keep counting
            present = conn.execute(
                select(func.count()).select_from(rows).where(rows.c.buffer_id == handle.buffer_id)
            ).scalar_one()
            values = {
                **limiter.settings(),
                "inserted_base": int(inserted) - int(present),
                "discarded_base": int(discarded),
                "samples": 0,
                "created_at": time.time(),
            }
            conn.execute(delete(rate_limits).where(this))
            conn.execute(rate_limits.insert().values(buffer_id=handle.buffer_id, **values))

    def _row(self, conn: Connection) -> Any:
        """The limit's row, with what the buffer counted since it was set (``counted``:
        inserted less discarded; ``discarded``), when rows were last inserted
        (``inserted_at``) and the database's clock (``now``)."""
        buffer_id = self.handle.buffer_id
        stmt = select(
            rate_limits,
            _counted(buffer_id).label("counted"),
            _since_limit(buffer_id, discarded_total(buffer_id), _R.discarded_base).label(
                "discarded"
            ),
            _since_limit(buffer_id, buffers.c.inserted_at, None).label("inserted_at"),
            self.handle.dialect.now().label("now"),
        ).where(_R.buffer_id == buffer_id)
        return conn.execute(stmt).first()

    def limiter(self) -> RateLimiter | None:
        with self.handle.errors("read the rate limit"), self.handle.read() as conn:
            row = self._row(conn)
        return None if row is None else RateLimiter.from_settings(row)

    def stats(self) -> RateLimitStats | None:
        with self.handle.errors("read the rate limit"), self.handle.read() as conn:
            row = self._row(conn)
        if row is None:
            return None
        limiter = RateLimiter.from_settings(row)
        counted, discarded = int(row.counted), int(row.discarded)
        return RateLimitStats(
            limiter,
            counted + discarded,
            int(row.samples),
            can_sample=_may_sample(row, counted, 1),
            can_insert=not limiter.block_writers or _may_insert(row, counted, 1),
            discarded=discarded,
            last_sample_at=_float_or_none(row.sampled_at),
            last_insert_at=_float_or_none(row.inserted_at),
        )

    def situation(self) -> str:
        """What each side of the buffer is doing, for the message of a wait that timed
        out: with a limit, its counts, settings and when learners last sampled and actors
        last inserted; without one, the buffer's own counts."""
        handle = self.handle
        with handle.errors("read the rate limit"), handle.read() as conn:
            row = self._row(conn)
            if row is not None:
                return f"Rate limit: {_describe(row)}"
            b = buffers.c
            found = conn.execute(
                select(
                    b.row_count,
                    b.inserted,
                    discarded_total(handle.buffer_id),
                    b.inserted_at,
                    handle.dialect.now(),
                ).where(b.id == handle.buffer_id)
            ).one()
        held, inserted, discarded, at, now = found
        last = (
            "actors have inserted no rows yet"
            if at is None
            else f"actors inserted last {_ago(float(now), at)}"
        )
        return (
            f"Buffer {handle.name!r} holds {int(held)} rows; inserted {int(inserted)} ever, of "
            f"which {int(discarded)} discarded (never drawable); {last}; no rate limit"
        )

    # -- samplers ------------------------------------------------------------------------
    def maybe_limited(self) -> bool:
        """Whether the buffer had a limit when this handle last looked (read now if it
        never did): for a caller that checks again in its own transaction."""
        return self.limited() if self.seen is None else bool(self.seen[1])

    def limited(self, since: float | None = None) -> bool:
        """Whether the buffer has a limit: as a key index read after ``since`` (a monotonic
        time) told, else read now (no write lock)."""
        seen = self.seen
        if since is None or seen is None or seen[0] < since:
            with self.handle.errors("read the rate limit"), self.handle.read() as conn:
                limited = bool(conn.execute(select(limited_flag(self.handle.buffer_id))).scalar())
            self.observe(limited)
            seen = self.seen
        return seen is not None and bool(seen[1])

    def acquire(
        self,
        n: int,
        since: float | None = None,
        *,
        at_least: int | None = None,
        unit: int = 1,
        timeout: float | None = None,
    ) -> int:
        """Count ``n`` samples against the budget, waiting while it is spent; returns how
        many were counted (0 when the buffer has no limit). ``since``: a monotonic time
        after which a key index read told whether the buffer has a limit (saves a round
        trip). ``at_least`` (a claim's ``min_batch_size``): take fewer than ``n``, down to
        ``at_least`` in steps of ``unit`` (a group's rows), when the budget allows no more;
        ``timeout``: wait no longer than this (a claim's own ``wait``) even if the limit's
        timeout is longer."""
        if not self.limited(since):
            return 0
        handle = self.handle
        this = _R.buffer_id == handle.buffer_id
        counted = _counted(handle.buffer_id)

        def take(m: int) -> Any:
            return (
                update(rate_limits)
                .where(
                    this,
                    counted >= _R.min_size,
                    counted * _R.samples_per_insert - _R.samples - literal(m) >= _R.min_diff,
                    handle.dialect.commit_without_flush(),
                )
                .values(samples=_R.samples + m, sampled_at=handle.dialect.now())
                .returning(_R.created_at)
            )

        waiting = RATE_LIMIT_WAIT.start()
        want = n
        while True:
            with handle.errors("count samples"), handle.single() as conn:
                under = conn.execute(take(want)).scalar()
                if under is not None:
                    self._counted_under.created_at = under
                    if waiting.pauses:
                        self.waits += 1
                        self.waited_s += waiting.elapsed()
                    return want
                row = self._row(conn)
            if row is None:
                self.observe(False)
                return 0
            limiter = RateLimiter.from_settings(row)
            limiter.check_sample(n if at_least is None else at_least)
            if at_least is not None:
                # As many as the budget allows now, whole units, no fewer than at_least.
                fits = n
                while fits >= at_least and not _may_sample(row, int(row.counted), fits):
                    fits -= unit
                if at_least <= fits < want:
                    want = fits
                    continue  # counted again atomically: another sampler may have drawn
                want = n
            limit = limiter.timeout_s
            if timeout is not None:
                limit = timeout if limit is None else min(limit, timeout)
            waiting.timeout_s = limit
            if not waiting.sleep():
                least = "" if at_least is None else f" (at least {at_least}, min_batch_size)"
                bound = _sample_bound(row, n if at_least is None else at_least)
                raise RateLimitedError(
                    f"waited {_seconds(limit)} s to sample {n} rows{least} of buffer "
                    f"{handle.name!r} "
                    f"under its rate limit: {bound}. {_describe(row)}. "
                    "Actors must insert more rows that can be drawn first (rows of groups "
                    "a group condition refuses, or gone stale, are discarded and count as "
                    "not inserted); or raise the limiter's timeout, sample less often, or "
                    "loosen samples_per_insert / min_size. Nothing was sampled"
                )

    def reserve(self) -> Reservation:
        """A reservation of samples under this limit (see
        :mod:`expstore.limits.reservation`): :meth:`acquire` counts, its options
        (``at_least``, ``unit``, ``timeout``) passed through; what is not used goes back to
        the limit it was counted under."""

        def count(n: int, since: float | None = None, **options: Any) -> tuple[int, bool]:
            before = self.waits
            got = self.acquire(n, since, **options)
            return got, self.waits != before

        return Reservation(count, self.refund, self.refund_later)

    def refund(self, n: int, *, current: bool = False) -> None:
        """Give back ``n`` counted samples that were not drawn (a short batch), to the limit
        they were counted under: a limit set since (``set_rate_limiter``, which starts
        counting afresh) is left as it is, and no count goes below zero. ``current``: to
        the buffer's limit now, whoever counted them (rows a dead learner's claim counted,
        given back by a takeover or claimed again after its lease ran out)."""
        self._refund_under(getattr(self._counted_under, "created_at", None), n, current)

    def refund_later(self) -> Callable[[int], None]:
        """:meth:`refund` bound to the limit this thread's last samples were counted
        under, for whoever gives them back later, in any thread (a claim released by
        another thread than the one that made it)."""
        return partial(self._refund_under, getattr(self._counted_under, "created_at", None))

    def _refund_under(self, under: Any, n: int, current: bool = False) -> None:
        if n > 0 and (under is not None or current):
            this = _R.buffer_id == self.handle.buffer_id
            back = update(rate_limits).where(this)
            if not current:
                back = back.where(_R.created_at == under)
            left = case((_R.samples >= n, _R.samples - n), else_=0)
            with self.handle.errors("count samples"), self.handle.single() as conn:
                conn.execute(back.values(samples=left))

    # -- writers -------------------------------------------------------------------------
    def check_write(self, conn: Connection, n: int) -> None:
        """Inside a write holding the buffer row: WriteBlocked if the limit holds writers
        and ``n`` more rows would run too far ahead of the samplers."""
        row = self._row(conn)
        if row is None or not row.block_writers:
            return
        RateLimiter.from_settings(row).check_insert(n)
        if not _may_insert(row, int(row.counted), n):
            raise WriteBlocked(f"{_insert_bound(row, n)}. {_describe(row)}")

    def wait_to_write(self, blocked: WriteBlocked, waiting: Waiting) -> None:
        """Sleep before a blocked write retries (``waiting``: the write's wait, from
        :data:`~expstore._retry.RATE_LIMIT_WAIT`); RateLimitedError past the timeout."""
        limiter = self.limiter()
        if limiter is None:
            return
        waiting.timeout_s = limiter.timeout_s
        if not waiting.sleep():
            raise RateLimitedError(
                f"waited {limiter.timeout_s} s to store rows into buffer {self.handle.name!r} "
                f"under its rate limit: {blocked}. Nothing was stored; learners must draw "
                "more rows first (start them, or see why they do not: a claim or sample "
                "that finds nothing to draw counts nothing), or raise the limiter's "
                "timeout, or set block_writers=False"
            )


def _may_sample(row: Any, inserted: int, n: int) -> bool:
    return bool(
        inserted >= row.min_size
        and inserted * row.samples_per_insert - (row.samples + n) >= row.min_diff
    )


def _may_insert(row: Any, inserted: int, n: int) -> bool:
    if inserted + n <= row.min_size:
        return True
    return bool((inserted + n) * row.samples_per_insert - row.samples <= row.max_diff)


def _seconds(value: float | None) -> str:
    return "forever" if value is None else f"{value:.3g}"


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def _sample_bound(row: Any, n: int) -> str:
    """Which bound of the limit holds a sample of ``n`` rows back, in its numbers."""
    counted = int(row.counted)
    if counted < row.min_size:
        return (
            f"min_size holds it: {counted} rows count as inserted (inserted less "
            f"discarded), min_size={row.min_size}"
        )
    allowed = counted * row.samples_per_insert - row.min_diff
    left = max(0, math.floor(allowed - row.samples))
    return (
        f"samples_per_insert holds it: {counted} rows counted as inserted allow "
        f"{math.floor(allowed)} samples, {row.samples} were drawn, so {left} more may go "
        f"and this sample needs {n}"
    )


def _insert_bound(row: Any, n: int) -> str:
    """Which bound holds a write of ``n`` rows back (block_writers), in its numbers."""
    ahead = (int(row.counted) + n) * row.samples_per_insert - row.samples
    owed = math.ceil(ahead - row.max_diff)
    return (
        f"block_writers holds it: {n} more rows would put inserts {ahead:g} samples ahead of "
        f"the {row.samples} drawn, more than max_diff={row.max_diff:g} (samples_per_insert "
        f"* min_size + error_buffer); learners must draw {owed} more rows first"
    )


def _describe(row: Any) -> str:
    """What each side has done under the limit: counts, settings, and when each last
    moved (database clock)."""
    limiter = RateLimiter.from_settings(row)
    settings = f"min_size={row.min_size}"
    if limiter.samples_per_insert is not None:
        settings += (
            f", samples_per_insert={limiter.samples_per_insert:g}, error_buffer={limiter.buffer:g}"
        )
    counts = (
        f"Since the limit was set: inserted {int(row.counted) + int(row.discarded)}, "
        f"discarded {int(row.discarded)}, sampled {int(row.samples)} ({settings}); "
    )
    now = float(row.now)
    if row.sampled_at is None:
        sampled = "learners have not sampled since the limit was set"
    else:
        sampled = f"learners sampled last {_ago(now, row.sampled_at)}"
    if row.inserted_at is None:
        inserted = "actors have inserted no rows yet"
    else:
        inserted = f"actors inserted last {_ago(now, row.inserted_at)}"
    return f"{counts}{sampled}; {inserted}"


def _ago(now: float, at: Any) -> str:
    return f"{max(0.0, now - float(at)):.1f} s ago"


class _RateLimitFeature(RowFeature):
    """A write to a rate-limited buffer checks its budget first (WriteBlocked: the writer
    rolls back, waits for samplers and tries again)."""

    name = "rate_limit"
    order = 10

    def columns(self, buffer_id: Any) -> list[Any]:
        return [limited_flag(buffer_id)]

    def setting(self, values: Sequence[Any]) -> Any:
        return True if values[0] else None

    def before_insert(self, ctx: WriteContext, setting: Any) -> None:
        # exact: the samples counted only grow meanwhile
        RateLimits(ctx.handle).check_write(ctx.conn, ctx.stored)


register(_RateLimitFeature())
