"""The SQL schema: one MetaData, the tables, and their indexes.

The Alembic migrations in ``migrations/`` create and upgrade exactly this schema; a test checks
that autogenerate finds no difference between the migrations' head and these tables.

- ``expstore_buffers``: one row per named buffer in the database.
- ``expstore_rows``: one row per experience. ``key`` (an integer primary key) gives the
  insertion order; metadata lives in typed, indexed columns, one per column of
  :mod:`expstore.model.layout` (read off the models); the rest of the experience is
  ``data`` (JSON, JSONB on Postgres) plus ``tensors`` (the codec's blob).
- ``expstore_priorities``: the stored priority of each row that has one.
- ``expstore_priority_log``: the recent priority updates of each buffer, so that other
  processes bring their cached priorities up to date without reading every row again.
- ``expstore_task_stats``: one row per task of a buffer that keeps summaries, what
  ``expstore stats`` reads instead of every row.
- ``expstore_tombstones``: a compact record of each row that left a buffer (evicted or
  deleted), the newest of them, so that lineage still answers for it.
- ``expstore_counters``: counters of the whole database (the largest row key ever handed
  out, so that SQLite never hands a deleted row's key out again).

The tables of claims, checkpoints, draw counts and rate limits are described where they
are defined below.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Select,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
    func,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import BYTEA, JSONB

from ..model.layout import COLUMNS, ID_COLUMN, ColumnSpec

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

#: Alembic's version table for expstore, prefixed so it never collides with an application's.
VERSION_TABLE = "expstore_alembic_version"

# SQLite only aliases the rowid (and so autoincrements) for a column typed exactly INTEGER.
KeyType = BigInteger().with_variant(Integer(), "sqlite")
JsonType = JSON().with_variant(JSONB(), "postgresql")
BlobType = LargeBinary().with_variant(BYTEA(), "postgresql")

buffers = Table(
    "expstore_buffers",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(255), nullable=False),
    Column("created_at", Double, nullable=False),
    # Bumped by every change other than an insert (delete, eviction, priority update), so
    # readers can tell cheaply whether cached key arrays are still valid.
    Column("version", BigInteger, nullable=False, server_default="0"),
    # The buffer's retention, the same for every handle and process that writes to it:
    # at most ``capacity`` rows (NULL: unlimited), evicted by ``eviction`` (NULL: fifo).
    Column("capacity", BigInteger, nullable=True),
    Column("eviction", String(32), nullable=True),
    # Bumped by every priority update; expstore_priority_log holds the recent ones.
    Column("priority_version", BigInteger, nullable=False, server_default="0"),
    # The trainer's current policy version (NULL: never set), see expstore.policy_versions;
    # with eviction "stale", rows more than ``stale_after`` versions older go at each write.
    Column("policy_version", BigInteger, nullable=True),
    Column("stale_after", BigInteger, nullable=True),
    # Rows ever stored into the buffer (evictions do not lower it): rate limits count
    # inserts by it. Writers hold this row already, so counting costs no extra lock.
    Column("inserted", BigInteger, nullable=False, server_default="0"),
    # When the last write inserted rows (database clock; NULL: never), for the waits'
    # messages; and rows ever inserted that can never be drawn (discarded: groups that a
    # group condition refuses, rows gone stale), which rate limits do not count as
    # inserted (see expstore.limits.counters.discard).
    Column("inserted_at", Double, nullable=True),
    Column("discarded", BigInteger, nullable=False, server_default="0"),
    # The rows the buffer holds now, kept by every write, delete and eviction in its own
    # transaction (on this row, which they hold anyway): len() and stats without counting,
    # FIFO eviction by an offset of the excess, and samplers' dense-key checks
    # (expstore.storage.key_space).
    Column("row_count", BigInteger, nullable=False, server_default="0"),
    # Per-task summaries (expstore_task_stats, see expstore.stats.task_stats): NULL when
    # the buffer keeps none; else the largest key when they were created (writers summarise
    # the rows above it) and how far the rows up to it are summarised already.
    Column("summary_from", BigInteger, nullable=True),
    Column("summary_through", BigInteger, nullable=True),
    # How many tombstones of rows that left the buffer it keeps (expstore_tombstones, see
    # expstore.retention.tombstones): NULL for the default, 0 for none.
    Column("keep_tombstones", BigInteger, nullable=True),
    # How arrays stored by digest are compressed (expstore.codec.compression; NULL: "auto",
    # "none": raw) and the largest array a row may hold (NULL: the default), the same for
    # every writer; rows written under another setting stay readable.
    Column("compression", String(16), nullable=True),
    Column("max_array_bytes", BigInteger, nullable=True),
    # Per payload path, the compression of the arrays under it, over the buffer's (a JSON
    # object of canonical paths to the values of ``compression``; NULL: none).
    Column("compression_fields", Text, nullable=True),
    UniqueConstraint("name"),
)


def _sql_type(spec: ColumnSpec) -> Any:
    """The SQL type of a layout column: strings with a maximum length as VARCHAR(n)."""
    if spec.python is str:
        return String(spec.max_length) if spec.max_length else Text
    return {int: BigInteger, float: Double, bool: Boolean}[spec.python]


def _column(spec: ColumnSpec) -> Column[Any]:
    return Column(spec.name, _sql_type(spec), nullable=spec.nullable)


def _column_indexes(name: str) -> tuple[Index, Index]:
    """The index of an indexed column, as each backend holds it.

    A filtered draw probes candidate keys against the condition (see
    :mod:`expstore.storage.key_space`). SQLite's ``(buffer_id, column)`` index holds the
    rowid, which is the key, so a probe reads the index alone; a Postgres index holds a
    heap address instead, so a probe through it or the primary key reads the table row of
    every candidate, a random page read of a large table. ``(buffer_id, column, key)``
    lets Postgres answer the probe from the index (an index-only scan).
    """
    return (
        Index(None, "buffer_id", name, info={"dialect": "sqlite"}).ddl_if(dialect="sqlite"),
        Index(None, "buffer_id", name, "key", info={"dialect": "postgresql"}).ddl_if(
            dialect="postgresql"
        ),
    )


#: Names of the indexes users create on payload paths (buffer.create_index) start with
#: this; they are the database's, not the schema's.
PATH_INDEX_PREFIX = "ix_expstore_rows_path_"


def compared(dialect_name: str) -> Callable[..., bool]:
    """Alembic's ``include_object`` for a database of this backend: what autogenerate
    compares with the schema leaves out the indexes of the other backend (see
    :func:`_column_indexes`) and the path indexes users create."""

    def include(obj: Any, name: str | None, type_: str, reflected: bool, _to: Any) -> bool:
        if type_ != "index":
            return True
        if name and name.startswith(PATH_INDEX_PREFIX):
            return False
        return reflected or obj.info.get("dialect", dialect_name) == dialect_name

    return include


rows = Table(
    "expstore_rows",
    metadata,
    Column("key", KeyType, primary_key=True, autoincrement=True),
    Column(
        "buffer_id",
        Integer,
        ForeignKey("expstore_buffers.id", ondelete="CASCADE"),
        nullable=False,
    ),
    _column(ID_COLUMN),
    *(_column(spec) for spec in COLUMNS),
    Column("data", JsonType, nullable=False),
    Column("tensors", BlobType, nullable=True),
    # A digest of the row's content (everything but id and execute_time), for
    # store_batch(..., dedup=...); see expstore.dedup. NULL for rows stored before
    # schema revision 0005.
    Column("content_hash", String(32), nullable=True),
    # Whether the row's value at each tracked path equals the previous and the next step's
    # (two bits per path: see expstore.tracking.changes), so changed(path) is a test of a
    # column through an index. 0 when the buffer tracks nothing (schema revision 0018).
    Column("change_flags", BigInteger, nullable=False, server_default="0"),
    UniqueConstraint("buffer_id", "id"),
    Index(None, "buffer_id", "key"),
    Index(None, "buffer_id", "task_id", "step"),
    Index(None, "buffer_id", "content_hash"),
    *(index for spec in COLUMNS if spec.indexed for index in _column_indexes(spec.name)),
    *_column_indexes("change_flags"),
)


def oldest_first(stmt: Select[Any], buffer_id: int) -> Select[Any]:
    """:func:`newest_first` the other way round."""
    return stmt.where(rows.c.buffer_id >= buffer_id, rows.c.buffer_id <= buffer_id).order_by(
        rows.c.buffer_id, rows.c.key
    )


def newest_first(stmt: Select[Any], buffer_id: int) -> Select[Any]:
    """``stmt`` limited to one buffer's rows, newest first, in a form every planner serves
    from the (buffer_id, key) index.

    With ``buffer_id = :b``, Postgres may walk the primary key backwards instead, filtering
    out every newer row of other buffers (seconds on a shared table). A range on buffer_id
    ordered by (buffer_id, key) can only be served by the composite index.
    """
    return stmt.where(rows.c.buffer_id >= buffer_id, rows.c.buffer_id <= buffer_id).order_by(
        rows.c.buffer_id.desc(), rows.c.key.desc()
    )


def loose_scan(column: Any, *where: Any, start: Any = None, below: Any = None) -> Select[Any]:
    """The distinct values of ``column`` among the rows matching ``where`` (NULLs left
    out), in order, from ``start`` on if given, or with ``below`` those under it, largest
    first: a recursive query that probes an index leading with ``where``'s columns and
    ``column`` once per value (a loose index scan), instead of reading every row.
    (``start`` or ``below`` bounds the first probe alone: in every probe, SQLite would seek
    it and filter the rest of the way to the next value.)"""
    pick: Any = func.min if below is None else func.max
    bound = [column < below] if below is not None else [] if start is None else [column >= start]
    first = select(pick(column).label("v")).where(*where, *bound)
    found = first.cte("expstore_distinct", recursive=True)
    beyond = column > found.c.v if below is None else column < found.c.v
    after = select(pick(column)).where(*where, beyond).scalar_subquery()
    found = found.union_all(select(after).where(found.c.v.is_not(None)))
    return select(found.c.v).where(found.c.v.is_not(None))


def _buffer_key() -> Column[Any]:
    """The buffer a row of a per-buffer table belongs to, first in its primary key: the
    row goes when the buffer does."""
    return Column(
        "buffer_id",
        Integer,
        ForeignKey("expstore_buffers.id", ondelete="CASCADE"),
        primary_key=True,
    )


#: The priorities set by the last updates of each buffer (``seq`` is the buffer's
#: ``priority_version`` after the update), kept for ``Tuning.priority_log_keep`` updates.
priority_log = Table(
    "expstore_priority_log",
    metadata,
    _buffer_key(),
    Column("seq", BigInteger, primary_key=True),
    Column("key", BigInteger, primary_key=True),
    Column("priority", Double, nullable=False),
)


def _row_key() -> Column[Any]:
    """The key of an experience row, for tables that keep something per row: their entry
    goes when the row goes."""
    return Column(
        "key",
        KeyType,
        ForeignKey("expstore_rows.key", ondelete="CASCADE"),
        primary_key=True,
        autoincrement=False,
    )


#: Stored priorities (prioritized replay), one row per experience row that has one (see
#: :mod:`expstore.priorities`). Kept apart from ``expstore_rows`` so that a
#: priority update writes a narrow row and two small indexes, not a new version of the
#: payload and every index of ``expstore_rows``; a row without an entry has no priority.
priorities = Table(
    "expstore_priorities",
    metadata,
    _row_key(),
    Column("buffer_id", Integer, nullable=False),  # no foreign key: see consumption
    Column("priority", Double, nullable=False),
    # The smallest and largest priority of a buffer in two index probes, which bound the
    # prioritized sampler's rejection draws (expstore.samplers.flat).
    Index(None, "buffer_id", "priority"),
)

#: Claims and consumption, one row per experience row ever claimed (see
#: :mod:`expstore.claims.queue`). Kept apart from ``expstore_rows`` so that claiming,
#: acking and releasing update a narrow row and never write a new version of the payload.
#: A row is claimable when it has no entry here, or its entry is not acked and holds no
#: live lease (``lease_until`` NULL after a release, or in the past after a crash).
consumption = Table(
    "expstore_consumption",
    metadata,
    _row_key(),
    # No foreign key to expstore_buffers: checking one would lock the buffer's row, which
    # every write holds, so claims would wait for writers (rows cascade to here instead).
    Column("buffer_id", Integer, nullable=False),
    # The claim that holds (or last acked) the row, and its consumer; NULL after a release.
    Column("claim_id", String(32), nullable=True),
    Column("consumer", String(255), nullable=True),
    # Seconds since the epoch by the database's clock, so leases mean the same on every host.
    Column("claimed_at", Double, nullable=True),
    Column("lease_until", Double, nullable=True),
    Column("acked_at", Double, nullable=True),
    # The consumer's checkpoint (expstore_checkpoints.seq) the row was acked with.
    Column("checkpoint_seq", BigInteger, nullable=True),
    Column("times_claimed", Integer, nullable=False, server_default="0"),
    Index(None, "buffer_id", "acked_at", "lease_until"),
    Index(None, "claim_id"),
)

#: Every checkpoint a consumer acked with (``seq`` counts per consumer from 1); the newest
#: is the one to resume from.
checkpoints = Table(
    "expstore_checkpoints",
    metadata,
    Column("buffer_id", Integer, primary_key=True),  # no foreign key: see consumption
    Column("consumer", String(255), primary_key=True),
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    # JSON text, stored as text (not JSON/JSONB) so it comes back exactly as given: no
    # numeric affinity on SQLite (1.0 came back as 1), no jsonb normalisation on Postgres
    # (1e20 came back as an int). The checkpoint None is the text "null".
    Column("state", Text, nullable=True),
    Column("created_at", Double, nullable=False),
)

#: One row per consumer of a buffer: its last checkpoint's number, locked by each ack with
#: a checkpoint, so two acks of one consumer number their checkpoints in turn (acks of
#: different consumers never wait on each other); and its ``generation``, the incarnation
#: ``buffer.consumer(name)`` opened last (0: never opened that way), which every claim,
#: ack, release and renewal checks holding this row (see
#: :mod:`expstore.claims.generations`).
consumers = Table(
    "expstore_consumers",
    metadata,
    Column("buffer_id", Integer, primary_key=True),  # no foreign key: see consumption
    Column("consumer", String(255), primary_key=True),
    Column("last_seq", BigInteger, nullable=False, server_default="0"),
    Column("generation", BigInteger, nullable=False, server_default="0"),
    # Rows the consumer ever acked (counted by each ack, which holds this row already): a
    # prompt queue's admission counts what the learners consumed by it.
    Column("acked", BigInteger, nullable=False, server_default="0"),
)

#: Arrays stored by digest (see :mod:`expstore.codec.compression`): each array of at least
#: the threshold's size once per buffer, whatever number of rows hold it. ``data`` is the
#: stored bytes (header, codec, stream), ``nbytes`` the array's own size. On Postgres the
#: column is STORAGE EXTERNAL: the bytes are compressed already, TOAST only moves them out.
arrays = Table(
    "expstore_arrays",
    metadata,
    _buffer_key(),
    Column("digest", String(32), primary_key=True),
    Column("nbytes", BigInteger, nullable=False),
    Column("data", BlobType, nullable=False),
)

#: Which row refers to which stored array: written with the row, gone with it (ON DELETE
#: CASCADE); an array no row refers to any more is deleted in the same transaction
#: (:mod:`expstore.arrays.stored_once`).
array_refs = Table(
    "expstore_array_refs",
    metadata,
    _row_key(),
    Column("digest", String(32), primary_key=True),
    Column("buffer_id", Integer, nullable=False),  # no foreign key: see consumption
    Index(None, "buffer_id", "digest"),
)

#: Paths whose changes a buffer tracks (``buffer.track_changes(path)``, see
#: :mod:`expstore.tracking.changes`): ``id`` names the path in ``expstore_changes``, never
#: given again; ``slot`` is the pair of bits the path's flags take in the rows'
#: ``change_flags`` (bit ``2 * slot``: same as the previous step, ``2 * slot + 1``: same as
#: the next), given again once the path is untracked (its bits are cleared then).
tracked_paths = Table(
    "expstore_tracked_paths",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column(
        "buffer_id",
        Integer,
        ForeignKey("expstore_buffers.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("path", String(1000), nullable=False),
    Column("slot", Integer, nullable=False, server_default="0"),
    UniqueConstraint("buffer_id", "path"),
    Index(None, "buffer_id", "slot", unique=True),
)

#: Per row and tracked path: the digest of the row's value there (NULL: nothing to compare,
#: see :mod:`expstore.codec.tracked`), from which every write and removal sets the rows'
#: ``change_flags`` again in their transaction.
changes = Table(
    "expstore_changes",
    metadata,
    _row_key(),  # first in the primary key, which the rows' ON DELETE CASCADE looks up
    Column(
        "path_id",
        Integer,
        ForeignKey("expstore_tracked_paths.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("digest", String(32), nullable=True),
)

#: An actor's saved progress on a claimed row (a prompt): the partial rollout so far, as
#: JSON text, saved by the claim that holds the row (``claim.save_progress``) and read by
#: whoever claims it next (``claim.progress``); an ack removes it, and it goes with its row.
progress = Table(
    "expstore_progress",
    metadata,
    _row_key(),
    Column("buffer_id", Integer, nullable=False),  # no foreign key: see consumption
    Column("claim_id", String(32), nullable=False),  # the claim that saved it
    Column("state", Text, nullable=False),
    Column("saved_at", Double, nullable=False),
)

#: A prompt's completion target (see :mod:`expstore.claims.prompts`): the row
#: stays claimable until ``done`` reaches ``target``, counted by the acks that store its
#: completions; the entry goes with its row.
targets = Table(
    "expstore_targets",
    metadata,
    _row_key(),
    Column("buffer_id", Integer, nullable=False),  # no foreign key: see consumption
    Column("target", Integer, nullable=False),
    Column("done", Integer, nullable=False, server_default="0"),
    Index(None, "buffer_id"),
)

#: Which prompt claim produced a row (``claim.ack(produce=rows, into=buffer)``): the
#: claim, its consumer (the actor) and the prompt row, so lineage links each completion to
#: the prompt and the actor that made it; the entry goes with the produced row.
produced = Table(
    "expstore_produced",
    metadata,
    _row_key(),
    Column("buffer_id", Integer, nullable=False),  # no foreign key: see consumption
    Column("claim_id", String(32), nullable=False),
    Column("consumer", String(255), nullable=False),
    # The prompt row, by its buffer, key and id (kept when the prompt itself goes).
    Column("prompt_buffer_id", Integer, nullable=False),
    Column("prompt_key", BigInteger, nullable=True),
    Column("prompt_id", Text, nullable=True),
    Column("produced_at", Double, nullable=False),
)

#: A prompt buffer's admission (see :mod:`expstore.claims.prompts`): claims of its
#: rows wait while the completions in flight and those stored into ``into_id`` but not yet
#: consumed reach ``(max_staleness + 1) * batch_size``, or ``max_backlog`` stored ones.
#: The row is locked by each claim of the buffer, so the bound holds for every host.
admission = Table(
    "expstore_admission",
    metadata,
    Column("buffer_id", Integer, primary_key=True),  # the prompts' buffer
    Column("into_id", Integer, nullable=False),  # the buffer the completions go to
    Column("batch_size", BigInteger, nullable=True),
    Column("max_staleness", BigInteger, nullable=True),
    Column("max_backlog", BigInteger, nullable=True),
    Column("timeout_s", Double, nullable=True),
)

#: Rows of a buffer a group claim's index found can never be drawn (their group complete
#: but refused by the group condition, or stale), each recorded once whichever index
#: found it, so the rate limit counts it as discarded once (see
#: :func:`expstore.limits.counters.discard_once`); the entry goes with its row.
discarded_rows = Table(
    "expstore_discarded",
    metadata,
    _row_key(),
    Column("buffer_id", Integer, nullable=False),  # no foreign key: see consumption
)

#: How many rows of each buffer :data:`discarded_rows` ever recorded: kept apart from
#: ``expstore_buffers`` so that a claim that discards never locks the buffer's row, which
#: every write holds (claims must not wait for writers, nor writers for claims).
discard_counts = Table(
    "expstore_discard_counts",
    metadata,
    Column("buffer_id", Integer, primary_key=True, autoincrement=False),
    Column("rows", BigInteger, nullable=False, server_default="0"),
)

#: The ready-group index of group claims (see :mod:`expstore.claims.ready_groups`):
#: one row per (buffer, condition, group spec, staleness) that claims have taken groups by,
#: with how far the index has followed the buffer (``scanned_to``: every group with a row
#: at or below that key is summarised; ``seen_version``: the buffer's ``version`` then;
#: ``oldest``: the oldest fresh version its stale groups were dropped below) and how many
#: groups it left out for good (``filtered``: complete but failing the group condition;
#: ``stale``: complete but older than the staleness limit).
group_specs = Table(
    "expstore_group_specs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("buffer_id", Integer, nullable=False),  # no foreign key: see consumption
    Column("digest", String(64), nullable=False),  # sha256 of ``spec``
    Column("spec", Text, nullable=False),
    Column("scanned_to", BigInteger, nullable=False, server_default="0"),
    Column("seen_version", BigInteger, nullable=False, server_default="0"),
    Column("oldest", BigInteger, nullable=True),
    Column("filtered", BigInteger, nullable=False, server_default="0"),
    Column("stale", BigInteger, nullable=False, server_default="0"),
    UniqueConstraint("buffer_id", "digest"),
)

#: The groups of each ready-group index that are not consumed: complete ones that pass the
#: group condition (``ready``) and ones still waiting for rows. An entry goes when a claim
#: of its rows is acked, when it goes stale, and when its rows go (found by the next claim).
ready_groups = Table(
    "expstore_ready_groups",
    metadata,
    Column("spec_id", Integer, primary_key=True, autoincrement=False),
    # No foreign key to the rows: an entry whose rows went is found by the next claim
    # (the buffer's change counter moved, or FIFO eviction passed its first key) and
    # summarised again, so a group that keeps enough rows stays claimable.
    Column("first_key", KeyType, primary_key=True, autoincrement=False),
    Column("buffer_id", Integer, nullable=False),
    # The group's value at group_by, as JSON (a column's value or a payload path's text).
    Column("value", JSON, nullable=False),
    Column("size", Integer, nullable=False),  # rows so far, up to the spec's size
    Column("ready", Boolean, nullable=False),  # complete and passing the group condition
    Column("version", BigInteger, nullable=True),  # the oldest policy_version among them
    Column("keys", Text, nullable=False),  # its rows' keys, comma-separated, in order
    Index(None, "spec_id", "ready", "first_key"),
    Index(None, "spec_id", "version"),
    Index(None, "first_key"),
)

#: How many times each row was drawn by samplers with ``consume_after`` (counted across
#: every process; a row drawn ``consume_after`` times leaves those samplers). Apart from
#: claims, so rows only ever sampled do not crowd the index of unacked claims.
sample_counts = Table(
    "expstore_sample_counts",
    metadata,
    _row_key(),
    Column("buffer_id", Integer, nullable=False),  # no foreign key: see consumption
    Column("times_sampled", Integer, nullable=False),
)

#: A buffer's rate limit (Reverb's ``RateLimiter``): its settings and the samples counted so
#: far, one row per limited buffer, apart from ``expstore_buffers`` so that samplers
#: counting never wait for writers holding the buffer's row (see
#: :mod:`expstore.limits.counters`).
rate_limits = Table(
    "expstore_rate_limits",
    metadata,
    Column("buffer_id", Integer, primary_key=True),  # no foreign key: see consumption
    Column("min_size", BigInteger, nullable=False),
    Column("samples_per_insert", Double, nullable=False),
    Column("min_diff", Double, nullable=False),
    Column("max_diff", Double, nullable=False),
    Column("block_writers", Boolean, nullable=False),
    Column("timeout_s", Double, nullable=True),
    # expstore_buffers.inserted when the limit was set, less the rows present then: the
    # limit counts inserts from there (rows already stored count as inserted).
    Column("inserted_base", BigInteger, nullable=False),
    Column("samples", BigInteger, nullable=False, server_default="0"),
    Column("created_at", Double, nullable=False),
    # expstore_buffers.discarded when the limit was set: the limit counts discards from there.
    Column("discarded_base", BigInteger, nullable=False, server_default="0"),
    # When samples were last counted under the limit (database clock; NULL: not yet).
    Column("sampled_at", Double, nullable=True),
)


#: Per-task summaries of the buffers that keep them (``buffer.create_summary()``; see
#: :mod:`expstore.stats.task_stats`): a task's rows, their rewards, times and policy
#: versions (counts, sums, sums of squares, extremes) and its last row (by step, then key).
task_stats = Table(
    "expstore_task_stats",
    metadata,
    _buffer_key(),
    Column("task_id", String(255), primary_key=True),
    Column("rows", BigInteger, nullable=False),
    Column("reward_count", BigInteger, nullable=False),
    Column("reward_sum", Double, nullable=False),
    Column("reward_sumsq", Double, nullable=False),
    Column("reward_min", Double, nullable=True),
    Column("reward_max", Double, nullable=True),
    Column("time_min", Double, nullable=False),
    Column("time_max", Double, nullable=False),
    Column("version_count", BigInteger, nullable=False),
    # The version sums are of (version - version_base), so large versions (timestamps,
    # say) keep their precision in a double.
    Column("version_base", BigInteger, nullable=True),
    Column("version_sum", Double, nullable=False),
    Column("version_sumsq", Double, nullable=False),
    Column("version_min", BigInteger, nullable=True),
    Column("version_max", BigInteger, nullable=True),
    Column("last_key", BigInteger, nullable=False),
    Column("last_step", BigInteger, nullable=False),
    Column("last_reward", Double, nullable=True),
    # The extremes or last row no longer describe the task (a delete took the rows that
    # held them from a long task): stats read its rows instead, until it is summarised
    # again (its counts and sums stay exact).
    Column("dirty", Boolean, nullable=False, server_default=false()),
    # Clustered by (buffer_id, task_id) on SQLite: stats scan a buffer's tasks in one range
    # of the table's own B-tree, and writers' upserts update one B-tree, not two.
    sqlite_with_rowid=False,
)
# The dirty tasks of a buffer (usually none) without a scan; the index holds only them.
# ``dirty`` is a key column too: with two equality columns to seek, SQLite's planner takes
# this index over the primary key even without statistics.
Index(
    "ix_expstore_task_stats_dirty",
    task_stats.c.buffer_id,
    task_stats.c.dirty,
    task_stats.c.task_id,
    # Spelled as each backend's queries spell the condition (SQLite: dirty = 1), so that
    # the planner sees the index serves them.
    sqlite_where=task_stats.c.dirty == true(),
    postgresql_where=task_stats.c.dirty,
)

#: A compact record of each row that left a buffer (see :mod:`expstore.retention.tombstones`):
#: when and why it went (``reason``: ``capacity``, ``stale``, ``delete`` or ``clear``; the
#: buffer's eviction ``policy`` for the first two) and its consumption record as it was
#: then, written in the transaction that deleted the row. ``seq`` numbers a buffer's
#: tombstones in the order they were written; only the newest ``keep_tombstones`` stay.
tombstones = Table(
    "expstore_tombstones",
    metadata,
    _buffer_key(),
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    Column("key", BigInteger, nullable=False),
    _column(ID_COLUMN),
    Column("reason", String(16), nullable=False),
    Column("policy", String(32), nullable=True),
    Column("evicted_at", Double, nullable=False),
    Column("consumer", String(255), nullable=True),
    Column("claimed_at", Double, nullable=True),
    Column("lease_until", Double, nullable=True),
    Column("acked_at", Double, nullable=True),
    Column("checkpoint_seq", BigInteger, nullable=True),
    Column("times_claimed", Integer, nullable=False, server_default="0"),
    # Lineage looks a row up by its id once it is no longer stored.
    Index(None, "buffer_id", "id"),
    # Clustered by (buffer_id, seq) on SQLite: trimming the oldest is one range of the
    # table's own B-tree.
    sqlite_with_rowid=False,
)

#: Counters of the whole database, by name. ``row_key``: the largest key ever given to a
#: row; SQLite would otherwise give the key of a deleted newest row to the next row
#: (its rowid is max + 1), which a reader could take for the row it knew.
ROW_KEY = "row_key"
counters = Table(
    "expstore_counters",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", BigInteger, nullable=False),
)
