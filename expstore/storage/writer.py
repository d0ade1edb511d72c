"""Writing: a batch of rows checked, encoded and inserted in one transaction, or not at all.

Rows are encoded chunk by chunk inside the transaction, so memory stays small; any failure
(a value the codec refuses, a value the model does not allow, a duplicate id) rolls it all
back. Each chunk's typed columns are checked in bulk against the row layout before it is
sent, so a row changed after it was built (``row.exp_meta.step = -1``) is refused with a
:class:`~expstore.errors.RowValidationError` naming the field, however it was changed.
"""

from __future__ import annotations

import logging
import math
import re
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from hashlib import blake2b
from operator import is_not, itemgetter
from typing import Any, NamedTuple

from pydantic import ValidationError
from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError

from .._retry import RATE_LIMIT_WAIT
from ..codec import HEADER_SIZE, PayloadWriter
from ..codec.compression import DEFAULT_MAX_ARRAY_BYTES, EXTERNAL_THRESHOLD
from ..db.dialects import WRITE_COLUMNS
from ..db.handle import BufferHandle, retried
from ..db.pipeline import Batched
from ..db.row_ids import ids_to_keys
from ..dedup import check_dedup, without_duplicates
from ..errors import (
    CodecError,
    DuplicateIdError,
    InvalidArgumentError,
    RowValidationError,
    UnsupportedTypeError,
)
from ..lifecycle.hooks import (
    BufferState,
    Fresh,
    Removed,
    StateChanged,
    WriteContext,
    hold_unchanged,
    read_state,
    send_state,
)
from ..lifecycle.registry import bump_version, count_inserted, count_removed, remove_ids
from ..limits.counters import RateLimits, WriteBlocked
from ..model.layout import (
    COLUMNS,
    ID_COLUMN,
    META_COLUMNS,
    PAYLOAD_FIELDS,
    PAYLOAD_TYPES,
    SCALAR_COLUMNS,
    ColumnSpec,
)
from ..model.rows import DataRow
from ..retention.capacity import Retention

__all__ = [
    "KEPT_ROWS",
    "WRITE_CHUNK",
    "RowSource",
    "StoreReport",
    "Written",
    "column_ok",
    "content_digest",
    "store_batch",
    "store_rows",
]

_log = logging.getLogger("expstore.writer")

#: Rows encoded and sent per round trip inside one store_batch transaction.
WRITE_CHUNK = 1000
#: A write of at most this many rows keeps them, encoded, until its insert says their
#: keys (see :class:`Written`).
KEPT_ROWS = 1024

# The encoded tuple is (buffer_id, id, *metadata, *scalars, data, tensors, content_hash,
# change_flags): WRITE_COLUMNS. change_flags is 0 as encoded; a write to a buffer that tracks
# changes sets it (see expstore.tracking.changes).
assert WRITE_COLUMNS == (
    "buffer_id",
    "id",
    *META_COLUMNS,
    *SCALAR_COLUMNS,
    "data",
    "tensors",
    "content_hash",
    "change_flags",
)
_meta_values = itemgetter(*META_COLUMNS)
#: The metadata a row's content hash covers: all but execute_time (a retried rollout is
#: the same content stored at another time).
_hashed_meta = itemgetter(*(c for c in META_COLUMNS if c != "execute_time"))
_scalar_values = itemgetter(*SCALAR_COLUMNS)
_payload_values = itemgetter(*PAYLOAD_FIELDS)
#: (position in the encoded tuple, column) of every typed column a row sets.
_CHECKED = tuple((WRITE_COLUMNS.index(spec.name), spec) for spec in (ID_COLUMN, *COLUMNS))
_SURROGATE = re.compile("[\ud800-\udfff]")
#: The type each checked column's values may have as they are (None aside, where allowed);
#: any other goes to pydantic.
_ALLOWED = {spec.name: {spec.python} for _, spec in _CHECKED}
_STR = {str}
#: (position among the payload fields, the types it may hold) where the model says.
_PAYLOAD_CHECKED = tuple(
    (PAYLOAD_FIELDS.index(name), set(kinds)) for name, kinds in PAYLOAD_TYPES.items()
)
_present = partial(is_not, None)


class StoreReport(NamedTuple):
    """What one ``store_batch`` (or ``extend``) did, in its one transaction:
    ``buffer.store_batch(rows, report=True)``.

    - ``stored``: rows of the batch inserted (what ``store_batch`` returns without
      ``report``);
    - ``duplicates``: rows left out by ``dedup="skip"`` (their content was stored already);
    - ``evicted_capacity``, ``evicted_stale``: rows the write's eviction removed beyond
      the capacity, and as stale (eviction ``"stale"``), older rows and the batch's own;
    - ``evicted_at_once``: of those, rows of this batch, stored and evicted by the same
      write (a group of a policy version already too old for ``"stale"``, a batch larger
      than the capacity). They leave tombstones like any evicted row, so
      ``buffer.lineage`` says ``evicted``.

    ``kept`` is how many of the batch's rows the buffer holds after the write.
    """

    stored: int
    duplicates: int = 0
    evicted_capacity: int = 0
    evicted_stale: int = 0
    evicted_at_once: int = 0

    @property
    def kept(self) -> int:
        """Rows of the batch the buffer holds after the write."""
        return self.stored - self.evicted_at_once

    @property
    def evicted(self) -> int:
        """Rows the write's eviction removed, whatever the reason."""
        return self.evicted_capacity + self.evicted_stale


class Written(NamedTuple):
    """What one write found and did: the buffer's retention as the write found it
    (capacity, eviction), its report, and the rows it inserted with their keys where the
    insert said them (a batch of at most :data:`KEPT_ROWS` on SQLite, of at most
    :data:`~expstore.db.dialects.SMALL_INSERT` on Postgres, none of whose arrays is stored
    by digest; else None)."""

    capacity: Any
    policy: str
    report: StoreReport
    fresh: Fresh | None = None


class RowSource(ABC):
    """Rows the writer encodes a chunk at a time: DataRows (or anything read as they
    are), or a batch of columns encoded column by column (:mod:`expstore.model.columnar`).

    The writer sets :attr:`max_array_bytes` from the buffer's row before encoding; encoding
    fills :attr:`external` with the arrays each row refers to by digest (see
    :mod:`expstore.arrays.stored_once`)."""

    max_array_bytes: int = DEFAULT_MAX_ARRAY_BYTES

    @property
    def external(self) -> dict[str, list[tuple[str, Any]]]:
        """``(digest, array)`` of the arrays each encoded row refers to, by row id."""
        found: dict[str, list[tuple[str, Any]]] | None = self.__dict__.get("_external")
        if found is None:
            found = self.__dict__["_external"] = {}
        return found

    @property
    @abstractmethod
    def ids(self) -> Sequence[str]:
        """The rows' ids, in order."""

    def __len__(self) -> int:
        return len(self.ids)

    @abstractmethod
    def encode(self, start: int, stop: int, buffer_id: int) -> list[tuple[Any, ...]]:
        """Rows ``start:stop`` in WRITE_COLUMNS order, checked (RowValidationError for a
        row that breaks its model)."""


class _Rows(RowSource):
    def __init__(self, rows: list[Any]) -> None:
        self.rows = rows

    @property
    def ids(self) -> list[str]:
        return [row.id for row in self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def encode(self, start: int, stop: int, buffer_id: int) -> list[tuple[Any, ...]]:
        return encode_chunk(self.rows[start:stop], buffer_id, self.max_array_bytes, self.external)


def as_source(batch: Sequence[Any] | RowSource) -> RowSource:
    """``batch`` as the writer reads it (rows already prepared, or a RowSource)."""
    return batch if isinstance(batch, RowSource) else _Rows(list(batch))


def prepare(batch: Sequence[DataRow]) -> list[DataRow]:
    """Check the batch's shape and ids before anything is written."""
    if batch is None or isinstance(batch, (DataRow, dict, str, bytes)):
        raise UnsupportedTypeError(
            f"store_batch() needs a list of DataRow, got {type(batch).__name__}; "
            "use store() for one row"
        )
    items = list(batch)
    if items and all(type(row) is DataRow for row in items):
        # The common case in one pass; anything else is explained below.
        if len({row.id for row in items}) == len(items):
            return items
    prepared: list[DataRow] = []
    seen: set[str] = set()
    for position, row in enumerate(items):
        if row is None:
            raise InvalidArgumentError(
                f"store_batch() got None at position {position}; every item must be a "
                "DataRow. Nothing was stored"
            )
        if isinstance(row, dict):
            row = DataRow.model_validate(row)
        elif not isinstance(row, DataRow):
            to_dict = getattr(row, "to_dict", None)  # AWorld's own dataclass rows
            if not callable(to_dict):
                raise UnsupportedTypeError(
                    f"store_batch() expected DataRow items (or AWorld rows with to_dict()), "
                    f"got {type(row).__name__} at position {position}. Nothing was stored"
                )
            row = DataRow.model_validate(to_dict())
        if row.id in seen:
            raise DuplicateIdError(
                f"row id {row.id!r} appears twice in one batch; ids must be unique. "
                "Nothing was stored"
            )
        seen.add(row.id)
        prepared.append(row)
    if not prepared:
        raise InvalidArgumentError("store_batch() got an empty batch; give at least one DataRow")
    return prepared


def store_batch(handle: BufferHandle, rows: Sequence[DataRow], dedup: str | None = None) -> Written:
    """Store every row in one transaction, or none; returns the buffer's retention as the
    write found it (capacity, eviction) and what the write did (see
    :mod:`expstore.dedup` for ``dedup``)."""
    check_dedup(dedup)
    return store_rows(handle, prepare(rows), dedup)


def store_rows(
    handle: BufferHandle,
    batch: Sequence[Any] | RowSource,
    dedup: str | None = None,
    then: Callable[[Connection], None] | None = None,
) -> Written:
    """:func:`store_batch` of rows already prepared: DataRows, anything the writer reads
    as it reads them (``id``, ``exp_meta.__dict__``, ``exp_data.__dict__``), whose typed
    columns it checks the same way, or a :class:`RowSource`. ``then(conn)``: more writes
    of the caller's, in the same transaction after the rows (a prompt's completion
    target)."""
    dedup = check_dedup(dedup)
    source = as_source(batch)
    waiting = RATE_LIMIT_WAIT.start()

    def write() -> Written:
        while True:
            try:
                return _write(handle, source, dedup, then)
            except WriteBlocked as blocked:  # rolled back: wait for samplers, then again
                RateLimits(handle).wait_to_write(blocked, waiting)

    # A serialisation failure or deadlock rolled the whole write back: try again.
    done = retried(write)
    _wrote(handle, done.report.stored)
    return done._replace(capacity=None if done.capacity is None else int(done.capacity))


class GroupRolledBack(Exception):
    """Internal: :func:`store_together`'s transaction failed before its commit and was
    rolled back whole (the cause is ``__cause__``): each write may run again alone."""


def store_together(
    handle: BufferHandle, writes: Sequence[tuple[Sequence[Any] | RowSource, str | None]]
) -> tuple[int | None, str, list[StoreReport]]:
    """Several writes' rows in ONE transaction (a group commit), each written as
    :func:`store_rows` writes it alone, in order, with its own ``dedup``: one commit for
    all, all or none. Returns the retention as the last write found it and a report per
    write. An error before the commit rolls every write back and raises
    :class:`GroupRolledBack` from it (a rate limit's ``block_writers`` hold included:
    WriteBlocked is its cause, not waited out); an error at the commit itself (its
    outcome unknown) is raised as it is."""
    sources = [(as_source(batch), check_dedup(dedup)) for batch, dedup in writes]
    before_commit = [False]

    def write() -> list[Written]:
        before_commit[0] = False
        with handle.errors("store rows"), handle.write() as conn:
            try:
                return [write_in(handle, conn, source, dedup) for source, dedup in sources]
            except BaseException:
                before_commit[0] = True  # the transaction is rolled back by the block
                raise

    try:
        done = retried(write)
    except Exception as exc:
        if before_commit[0]:
            raise GroupRolledBack() from exc
        raise
    _wrote(handle, sum(d.report.stored for d in done))
    capacity, policy = done[-1].capacity, done[-1].policy
    return (None if capacity is None else int(capacity)), policy, [d.report for d in done]


def replace_rows(
    handle: BufferHandle,
    rows: Sequence[Any] | RowSource,
    replacing: Callable[[Connection], Sequence[str]] | None = None,
    then: Callable[[Connection], None] | None = None,
) -> None:
    """Store ``rows``, each replacing the stored row of its id if there is one (an upsert
    by id: rows are immutable, so the old row is removed, as ``delete()`` removes it, with
    its tombstone and what the buffer's features keep of it, and the new one inserted):
    the removals and the insert in one transaction, all or nothing.

    One write: the buffer's state is read once, with its row taken, and serves the
    removal and the insert; the removal's count and the new version readers need go into
    the write's one update of the buffer's row, and its capacity sees the removed rows
    gone (:func:`expstore.lifecycle.registry.remove_ids`: one statement on Postgres).
    ``rows``: DataRows (checked first, as :func:`store_batch` checks them), or rows a
    dict of columns gave (``column_source``: checked as they were cut, or a
    :class:`RowSource`). ``replacing(conn)``: the ids of the rows these replace, found in
    the write's transaction (None: the rows' own ids). ``then(conn)``: called after the
    insert, in the write's transaction (to read what it wrote: the new rows' keys, say)."""
    if isinstance(rows, RowSource):
        batch = rows
    elif all(isinstance(row, DataRow) for row in rows):
        batch = as_source(prepare(rows))
    else:
        batch = as_source(list(rows))
    ids = list(batch.ids)
    waiting = RATE_LIMIT_WAIT.start()

    def write() -> None:
        while True:
            try:
                with (
                    handle.errors("replace rows"),
                    _transaction(handle, then is None) as (
                        conn,
                        state,
                        tail,
                    ),
                ):
                    removed = Removed(state.newest, deferred=True)
                    doomed = ids if replacing is None else list(replacing(conn))
                    remove_ids(handle, conn, doomed, state, removed, len(ids))
                    write_in(handle, conn, batch, None, state, removed, tail=tail)
                    if then is not None:
                        then(conn)
                return
            except WriteBlocked as blocked:  # rolled back: wait for samplers, then again
                RateLimits(handle).wait_to_write(blocked, waiting)

    retried(write)
    _wrote(handle, len(batch))


def _wrote(handle: BufferHandle, stored: int) -> None:
    """After a write committed: the dialect's refresh of what its planner knows, which
    must not turn a committed write into an error (a caller would store it again)."""
    try:
        handle.dialect.wrote(handle.connections.engine, handle.buffer_id, stored)
    except Exception as exc:  # the rows are stored; the statistics catch up later
        _log.warning(
            "after a write of %d rows committed, refreshing statistics failed: %s", stored, exc
        )


def _write(
    handle: BufferHandle,
    batch: RowSource,
    dedup: str | None,
    then: Callable[[Connection], None] | None = None,
) -> Written:
    """One attempt at the write transaction; returns the retention it found and what it
    did."""
    with handle.errors("store rows"):
        try:
            with _transaction(handle, then is None) as (conn, state, tail):
                done = write_in(handle, conn, batch, dedup, state, tail=tail)
                if then is not None:
                    then(conn)
                return done
        except IntegrityError as exc:
            duplicate = duplicate_of(handle, batch)
            if duplicate is None:
                raise  # not a duplicate id: reported as the database said it
            raise duplicate from exc


@contextmanager
def _transaction(
    handle: BufferHandle, pipelined: bool
) -> Iterator[tuple[Connection, BufferState, Batched | None]]:
    """A write transaction of the handle's buffer and its state, read in it with the
    buffer's row taken: ``(conn, state, tail)``. On Postgres, where ``pipelined`` (nothing
    of the caller's reads what the write's insert wrote before the commit), BEGIN goes with
    the state's read and ``tail`` is the transaction, so write_in may send a few rows'
    insert with the COMMIT; otherwise ``tail`` is None. Committed when the block ends."""
    connections = handle.connections
    if pipelined and connections.batches_writes:
        with connections.batched_write() as tx:
            with tx.batch():
                state = send_state(handle, tx.conn)
            yield tx.conn, state(), tx
        return
    with handle.write() as conn:
        yield conn, read_state(handle, conn), None


def duplicate_of(handle: BufferHandle, batch: RowSource) -> DuplicateIdError | None:
    """After an IntegrityError of a write of ``batch`` (rolled back): the DuplicateIdError
    naming the ids stored already, or None (another constraint)."""
    return _duplicate_error(handle, list(batch.ids))


def write_in(
    handle: BufferHandle,
    conn: Connection,
    batch: RowSource,
    dedup: str | None,
    state: BufferState | None = None,
    removed: Removed | None = None,
    tail: Batched | None = None,
) -> Written:
    """The write of ``batch`` into the handle's buffer inside the caller's transaction
    (``conn``, of the handle's database), as the row lifecycle has it
    (:mod:`expstore.lifecycle.hooks`): the buffer's state read with its row taken,
    the rows encoded (dedup), then the hooks of the features this buffer uses around the
    insert (a rate limit's check may raise WriteBlocked: the caller rolls back, waits and
    tries again; eviction comes last). Returns the retention it found and what it did. A
    duplicate id raises IntegrityError: once rolled back, :func:`duplicate_of` says
    which ids. ``state`` and ``removed``: the buffer's state as the caller's transaction
    read it (its row taken) and the removals it made before the write, deferred to the
    write's count (:func:`replace_rows`); by default read now, none. ``tail``: the
    caller's transaction, when it is :func:`~expstore.db.pipeline.batched` and the write
    is its last: where the dialect may pipeline the insert (a few rows, counted on the
    buffer's row by the insert itself), nothing was removed and no feature has anything
    to do after the insert (:meth:`~expstore.lifecycle.hooks.RowFeature.quiet_after`),
    the insert is sent with the COMMIT, in its round trip: the buffer's row, locked by
    the state's read, is held one round trip less."""
    try:
        # Writers of a buffer take turns on its row, so keys are handed out in commit
        # order (readers' cached key indexes only ever need the keys above the largest they
        # saw), a capacity stays exact, and the rows above the largest key now are this
        # write's.
        if state is None:
            state = read_state(handle, conn)
        elif state.fingerprint is not None and not (
            tail is not None and dedup is None and removed is None and state.reads_unlocked()
        ):
            _hold(handle, conn, state)  # read without the row: take it now
        if removed is None:
            # (removals' counts are deferred to the write's one update of the buffer's row)
            removed = Removed(state.newest, deferred=True)
        ctx = WriteContext(handle, conn, state, batch, iter(()), len(batch), removed)
        state.run("prepare", ctx)
        ctx.chunks = _encoded_chunks(handle, batch)
        if dedup is not None:  # exact: writers of the buffer take turns
            encoded = [row for chunk in ctx.chunks for row in chunk]
            kept = without_duplicates(handle, conn, encoded, dedup)
            ctx.stored = len(kept)
            ctx.chunks = iter([kept[i : i + WRITE_CHUNK] for i in range(0, len(kept), WRITE_CHUNK)])
        state.run("before_insert", ctx)
        if ctx.stored and tail is not None and _with_commit(ctx, tail):
            pass  # sent with the COMMIT, counted by itself; nothing to do after it
        else:
            if state.fingerprint is not None:
                _hold(handle, conn, state)  # the insert takes keys holding the row
            if ctx.stored:
                # (the insert may count its rows on the buffer's row itself: Postgres, a few)
                counting = 0 if removed.counted_inserts else ctx.stored
                # A small batch's encoded rows are kept until the insert says their keys:
                # the hooks need no statement to learn them, and the caller may keep
                # their values (the row cache, see SqlStorage).
                keeps = ctx.stored <= KEPT_ROWS and handle.dialect.says_keys(ctx.stored)
                held: list[tuple[Any, ...]] | None = [] if keeps else None
                chunks = ctx.chunks if held is None else _keeping(ctx.chunks, held)
                inserted = handle.dialect.insert_rows(conn, chunks, state.keys, counting)
                if inserted.counted:
                    removed.counted_inserts = counting
                if held is not None and inserted.keys is not None:
                    ctx.inserted(held, inserted.keys)
                state.run("after_insert", ctx)
            state.run("after_write", ctx)
        # (rows a replace's removal counted already on the buffer's row: none otherwise)
        to_count = ctx.stored - removed.counted_inserts
        if to_count:
            count_inserted(handle, conn, to_count, removed.uncounted, removed.changed)
        else:
            count_removed(handle, conn, removed.uncounted)
            if removed.changed:
                bump_version(handle, conn)
    except UnicodeEncodeError as exc:  # a string the row's validation could not see
        text = exc.object[exc.start : exc.end]
        raise CodecError(
            f"a string in the batch holds {text!r}, which is not Unicode text "
            f"({exc.reason}) and no database can store; decode the text with "
            "errors='replace' or store its bytes. Nothing was stored"
        ) from exc
    report = StoreReport(
        ctx.stored,
        len(batch) - ctx.stored,
        removed.by_reason.get("capacity", 0),
        removed.by_reason.get("stale", 0),
        removed.new,
    )
    retention: Retention = state.setting("retention")
    fresh = ctx.fresh if ctx.fresh is not None and not batch.external else None
    return Written(retention.capacity, retention.policy, report, fresh)


def _keeping(
    chunks: Iterator[list[tuple[Any, ...]]], into: list[tuple[Any, ...]]
) -> Iterator[list[tuple[Any, ...]]]:
    """``chunks`` as they are, each also added to ``into`` as it goes by."""
    for chunk in chunks:
        into.extend(chunk)
        yield chunk


def _hold(handle: BufferHandle, conn: Connection, state: BufferState) -> None:
    """Take the buffer's row for a write whose ``state`` was read without it: the state
    read again holding it, the same settings (else StateChanged: the caller writes again
    from the start), its counts as they are now."""
    held = read_state(handle, conn, fingerprint=True)
    if held.fingerprint != state.fingerprint:
        raise StateChanged()
    state.newest, state.keys, state.settings = held.newest, held.keys, held.settings
    state.fingerprint = None


def _with_commit(ctx: WriteContext, tail: Batched) -> bool:
    """Send the write's insert with ``tail``'s COMMIT (see :func:`write_in`'s ``tail``),
    if it may go there; returns whether it does (else nothing is sent, ``ctx.chunks``
    still hold the rows)."""
    removed = ctx.removed
    dialect = ctx.handle.dialect
    if (
        removed.counted_inserts
        or removed.total
        or removed.uncounted
        or removed.changed
        or not dialect.pipelines_insert(ctx.stored)
    ):
        return False
    chunks = list(ctx.chunks)  # encoded now (what a feature does after may depend on it)
    ctx.chunks = iter(chunks)
    if len(chunks) != 1 or len(chunks[0]) != ctx.stored:
        return False
    state = ctx.state
    for hook in ("after_insert", "after_write"):
        if not all(feature.quiet_after(ctx, setting) for feature, setting in state.hooked(hook)):
            return False
    conn, keys, stored = ctx.conn, state.keys, ctx.stored
    if state.fingerprint is not None:  # read without the row: taken, and checked, first
        handle = ctx.handle
        tail.at_commit(lambda: hold_unchanged(handle, conn, state))
    tail.at_commit(lambda: dialect.insert_rows(conn, iter(chunks), keys, stored, keys_said=False))
    removed.counted_inserts = stored  # by the insert (see Dialect.pipelines_insert)
    return True


def _encoded_chunks(handle: BufferHandle, batch: RowSource) -> Iterator[list[tuple[Any, ...]]]:
    """Encoded, checked chunks of ``batch``. Where the dialect gains from it, the next
    chunk is encoded in a thread while the current one is sent, with at most two chunks in
    flight; otherwise one after the other."""
    total = len(batch)
    chunks = [(i, min(i + WRITE_CHUNK, total)) for i in range(0, total, WRITE_CHUNK)]
    buffer_id = handle.buffer_id
    if len(chunks) == 1 or not handle.dialect.encodes_in_thread:
        # sqlite3 wants the GIL back between rows, so an encoding thread only makes it
        # wait (measured: a few percent slower than encoding in turn).
        for start, stop in chunks:
            yield batch.encode(start, stop, buffer_id)
        return
    with ThreadPoolExecutor(1, thread_name_prefix="expstore-encode") as pool:
        pending = deque(pool.submit(batch.encode, *c, buffer_id) for c in chunks[:2])
        queued = len(pending)
        while pending:
            params = pending.popleft().result()
            if queued < len(chunks):
                pending.append(pool.submit(batch.encode, *chunks[queued], buffer_id))
                queued += 1
            yield params


def encode_chunk(
    chunk: Sequence[DataRow],
    buffer_id: int,
    max_array_bytes: int = DEFAULT_MAX_ARRAY_BYTES,
    external: dict[str, list[tuple[str, Any]]] | None = None,
) -> list[tuple[Any, ...]]:
    """Each row's values in WRITE_COLUMNS order, the document as JSON text, checked: a row
    that breaks its model raises RowValidationError. Arrays of at least
    EXTERNAL_THRESHOLD bytes are referred to by digest, and listed in ``external`` by row
    id; an array over ``max_array_bytes`` raises CodecError."""
    writer = PayloadWriter(EXTERNAL_THRESHOLD, max_array_bytes)
    held = {} if external is None else external
    out, payloads = _encode(chunk, buffer_id, writer, held)
    for at in _suspects(out, payloads):
        out[at] = _encode([_validated(chunk[at])], buffer_id, writer, held)[0][0]
    return out


def _encode(
    chunk: Sequence[DataRow],
    buffer_id: int,
    writer: PayloadWriter,
    external: dict[str, list[tuple[str, Any]]],
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The hot loop of a write, one pass with the fields read from the models'
    ``__dict__``: the encoded tuples, and each row's payload values."""
    out: list[tuple[Any, ...]] = []
    payloads: list[tuple[Any, ...]] = []
    append, keep = out.append, payloads.append
    encode = writer.encode
    for row in chunk:
        m, d = row.exp_meta.__dict__, row.exp_data.__dict__
        payload = _payload_values(d)
        keep(payload)
        try:
            doc, blob = encode(dict(zip(PAYLOAD_FIELDS, payload, strict=True)), row.id)
        except CodecError as exc:
            raise CodecError(f"row {row.id}: {exc}. Nothing was stored") from exc
        held = writer.external
        if held:
            external[row.id] = held
        scalars = _scalar_values(d)
        digest = content_hash(_hashed_meta(m), scalars, doc, blob)
        append((buffer_id, row.id, *_meta_values(m), *scalars, doc, blob, digest, 0))
    return out, payloads


def content_hash(meta: tuple[Any, ...], scalars: tuple[Any, ...], doc: str, blob: Any) -> str:
    """The digest of a row's content as stored (for ``dedup``): its metadata but
    execute_time, its scalar fields, its JSON document and its tensor bytes."""
    return content_digest(repr((meta, scalars)), doc, blob)


def content_digest(key: str, doc: str, blob: Any) -> str:
    """:func:`content_hash` from ``repr((meta, scalars))`` already written."""
    digest = blake2b(key.encode(), digest_size=16)
    digest.update(doc.encode("utf-8", "surrogatepass"))
    if blob is not None:  # the tensor bytes, not the header (its checksum covers the id)
        digest.update(b"\x00")
        digest.update(memoryview(blob)[HEADER_SIZE:])
    return digest.hexdigest()


def _suspects(encoded: list[tuple[Any, ...]], payloads: list[tuple[Any, ...]]) -> list[int]:
    """Positions of rows that may break their model: each column checked for the whole
    chunk at once, then row by row only where a column failed."""
    columns = list(zip(*encoded, strict=True))
    suspects: set[int] = set()
    for at, spec in _CHECKED:
        values = columns[at]
        if not column_ok(values, spec):
            suspects.update(i for i, value in enumerate(values) if not _value_ok(value, spec))
    payload_columns = list(zip(*payloads, strict=True))
    for at, kinds in _PAYLOAD_CHECKED:
        values = payload_columns[at]
        if not set(map(type, values)) <= kinds:
            suspects.update(i for i, value in enumerate(values) if type(value) not in kinds)
    return sorted(suspects)


def column_ok(values: Sequence[Any], spec: ColumnSpec) -> bool:
    """Whether every value is plainly valid for ``spec`` (C-speed checks over the column);
    False does not mean a value is invalid, only that rows must be looked at one by one."""
    if spec.nullable:
        values = list(filter(_present, values))
        if not values:
            return True
    if spec.python is str:
        if not set(map(type, values)) <= _STR:
            return False
        lengths = list(map(len, values))
        if spec.max_length is not None and max(lengths) > spec.max_length:
            return False
        if spec.min_length is not None and min(lengths) < spec.min_length:
            return False
        text = "".join(values)
        return "\x00" not in text and (text.isascii() or _SURROGATE.search(text) is None)
    if not set(map(type, values)) <= _ALLOWED[spec.name]:
        return False
    if spec.python is float:
        return all(map(math.isfinite, values))
    if spec.ge is not None and min(values) < spec.ge:
        return False
    return spec.le is None or max(values) <= spec.le


def _value_ok(value: Any, spec: ColumnSpec) -> bool:
    return column_ok([value], spec)


def _validated(row: DataRow) -> DataRow:
    """A suspect row validated again by its model: RowValidationError naming the field if
    it is invalid, else the row pydantic makes of its values."""
    try:
        return DataRow.model_validate(
            {
                "exp_meta": dict(row.exp_meta.__dict__),
                "exp_data": dict(row.exp_data.__dict__),
                "id": row.id,
            }
        )
    except ValidationError as exc:
        raise _row_error(row.id, exc) from None


class _StoreValidationError(RowValidationError):
    def __str__(self) -> str:
        return (
            f"{super().__str__()}\nThe row was changed after it was built; fix the field "
            "named above. Nothing of the batch was stored"
        )


def _row_error(row_id: str, exc: ValidationError) -> RowValidationError:
    details = [
        {key: error[key] for key in ("type", "loc", "input", "ctx") if key in error}
        for error in exc.errors()
    ]
    return _StoreValidationError.from_exception_data(f"DataRow {row_id!r}", details)  # type: ignore[arg-type]


def _duplicate_error(handle: BufferHandle, ids: list[str]) -> DuplicateIdError | None:
    """The error for a batch whose ids are already stored, or None if none is."""
    with handle.read() as conn:
        present = list(ids_to_keys(handle, conn, ids))
    if not present:
        return None
    shown = ", ".join(repr(i) for i in present[:5])
    return DuplicateIdError(
        f"row ids must be unique in buffer {handle.name!r}, but {shown} "
        f"{'is' if len(present) == 1 else 'are'} already stored. Nothing was stored; "
        "give the new rows fresh ids (the default id is a new uuid4)"
    )
