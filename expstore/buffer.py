"""ReplayBuffer: the facade trainers and agents use.

>>> from expstore import DataRow, Experience, ExpMeta, QueryBuilder, ReplayBuffer
>>> buffer = ReplayBuffer()  # a private in-memory SQLite store
>>> buffer.store(DataRow(exp_meta=ExpMeta(task_id="t1", agent_id="a1", step=0),
...                      exp_data=Experience(state={"url": "https://example.com"}, reward_t=1.0)))
>>> buffer.count(QueryBuilder().eq("exp_meta.task_id", "t1").build())
1
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, overload

import numpy as np
from sqlalchemy.engine import URL

from ._args import check_batch_size, check_consumer, check_flag
from .arrays.stored_once import ArraySetting
from .claims import (
    DEFAULT_LEASE_S,
    Admission,
    Claim,
    Consumer,
    admission_now,
    admission_setting,
    claim_rows,
    count_ready_groups,
    set_admission,
    store_prompts,
    wait_for_rows,
)
from .claims.prompts import AdmissionState
from .claims.queue import Lineage, QueueStats, queue_of
from .claims.ready_groups import GroupTally
from .converters.base import BatchT, Converter, as_converter
from .converters.default import DefaultConverter
from .db.tuning import Tuning
from .dedup import Dedup
from .errors import InvalidArgumentError, UnknownConsumerError, UnsupportedTypeError
from .io import to_arrow
from .limits.rate_limiter import RateLimiter, RateLimitStats
from .minari_io import export_minari
from .model.rows import DataRow
from .prefetch import Hooks, Prefetcher
from .query import QueryCondition
from .retention.capacity import RetentionSetting
from .retention.eviction import Eviction
from .samplers.base import Sampler, TaskSampler, as_sampler
from .samplers.group import GroupSampler
from .samplers.loop import SampleInfo, draw, draw_tasks
from .samplers.random_task import RandomTaskSampler
from .samplers.uniform import UniformSampler
from .stats.task_stats import SummaryState
from .storage.base import Storage
from .storage.cache import CacheStats
from .storage.reader import RowsPage
from .storage.sql import SqlStorage
from .storage.writer import StoreReport

__all__ = ["ReplayBuffer"]


class ReplayBuffer:
    """A durable, queryable replay buffer over a SQL :class:`Storage`.

    ``ReplayBuffer(storage=None, *, name="default", capacity=None, eviction=None, upgrade=False)``

    - ``storage``: ``None`` (default) gives a fresh in-memory SQLite store that no other
      buffer shares; a string or URL opens :class:`SqlStorage` there (``sqlite:///path.db``,
      ``postgresql+psycopg://user@host/db``); a :class:`Storage` is used as it is.
    - ``name``: which buffer of the database (one database holds many, isolated).
    - ``capacity``: at most this many rows remain after each write (default: unlimited).
    - ``eviction``: which rows go beyond capacity: ``"fifo"`` (default), ``"max_reward"``,
      ``"task_fifo"``. Both are kept with the buffer in the database, so every process
      that writes to it evicts alike: the first to give them sets them, a handle that gives
      neither uses them, one that asks for others raises ValueError, and
      :meth:`set_retention` changes them for everyone.
    - ``upgrade``: upgrade an older database schema instead of raising SchemaVersionError.
    - ``read_urls``: Postgres streaming replicas of the primary that reads (sampling,
      queries, stats, export) go to, writes staying on the primary; ``read_your_writes``
      makes a read after this handle's write wait until the replica has replayed it;
      ``max_lag_s`` leaves a replica further behind for the primary. See
      :mod:`expstore.db.replicas`.
    - ``tuning``: a :class:`~expstore.db.tuning.Tuning` for the storage opened at a URL,
      knobs for tests and measurements (default ``Tuning()``): how much it keeps or reads
      at a time, never what the buffer holds or the distribution a draw follows.
    - ``cache_bytes``: the budget in bytes of this handle's decoded-row cache (default
      an eighth of the machine's memory, at least 256 MiB; 0 turns it off): rows sampled
      again are not read and decoded again. It never chooses rows (the database does,
      every draw), so a row deleted, evicted, stale, spent or claimed is never returned
      from it. See :meth:`cache_stats` and
      :mod:`expstore.storage.cache`.
    """

    def __init__(
        self,
        storage: Storage | str | URL | None = None,
        *,
        name: str = "default",
        capacity: int | None = None,
        eviction: Eviction | None = None,
        upgrade: bool = False,
        read_urls: Sequence[str | URL] | None = None,
        read_your_writes: bool = False,
        max_lag_s: float | None = None,
        tuning: Tuning | None = None,
        cache_bytes: int | None = None,
    ) -> None:
        if storage is None:
            storage = "sqlite://"
        if isinstance(storage, (str, URL)):
            storage = SqlStorage(
                storage,
                name=name,
                capacity=capacity,
                eviction=eviction,
                upgrade=upgrade,
                read_urls=read_urls,
                read_your_writes=read_your_writes,
                max_lag_s=max_lag_s,
                tuning=tuning,
                cache_bytes=cache_bytes,
            )
        elif read_urls is not None or tuning is not None:
            given = "read_urls" if read_urls is not None else "tuning"
            raise InvalidArgumentError(
                f"{given} is given with a database URL, not with a Storage object: pass "
                f"ReplayBuffer(url, {given}=...) or SqlStorage(url, {given}=...)"
            )
        elif not isinstance(storage, Storage):
            raise UnsupportedTypeError(
                "ReplayBuffer(storage=...) expects None, a database URL or a Storage, "
                f"got {type(storage).__name__}"
            )
        if cache_bytes is not None:  # (a storage opened here has it already: the same)
            sql = storage
            if not isinstance(sql, SqlStorage):
                raise InvalidArgumentError(
                    f"cache_bytes is for a SqlStorage (a database URL); this storage is a "
                    f"{type(sql).__name__}, which keeps no row cache: leave it unset"
                )
            sql.set_cache_bytes(cache_bytes)
        self.storage: Storage = storage

    @property
    def sql(self) -> SqlStorage:
        """The buffer's :class:`SqlStorage`, with what only a SQL database keeps beside the
        rows: the claims queue (:mod:`expstore.claims`), the rate limit's settings
        (``sql.rate_limits``), path indexes, task summaries and the figures
        ``expstore stats`` computes in the database (``sql.summary``). The methods of this
        buffer that use them come here; a buffer over another :class:`Storage` raises
        UnsupportedTypeError, saying which storage it has."""
        storage = self.storage
        if not isinstance(storage, SqlStorage):
            raise UnsupportedTypeError(
                f"this needs a SQL storage (ReplayBuffer(url) or ReplayBuffer(SqlStorage("
                f"...))); this buffer's storage is a {type(storage).__name__}, which keeps "
                "only rows, priorities, policy versions and draw counts"
            )
        return storage

    # -- writing -------------------------------------------------------------------------
    def store(self, row: DataRow, *, dedup: Dedup = None) -> int:
        """Store one row; returns 1 (0 when ``dedup="skip"`` found its content stored)."""
        return self.storage.store(row, dedup=dedup)

    @overload
    def store_batch(
        self, rows: Sequence[DataRow], *, dedup: Dedup = None, report: Literal[False] = False
    ) -> int: ...

    @overload
    def store_batch(
        self, rows: Sequence[DataRow], *, dedup: Dedup = None, report: Literal[True]
    ) -> StoreReport: ...

    def store_batch(
        self, rows: Sequence[DataRow], *, dedup: Dedup = None, report: bool = False
    ) -> int | StoreReport:
        """Store every row in one transaction: all are validated first; all or none land.
        Returns how many rows were stored.

        ``dedup="skip"`` leaves out rows whose content (everything but the id and
        execute_time) a row of the buffer already holds, or an earlier row of the batch
        repeats, checked in the write's transaction so concurrent writers store a rollout
        once; ``"error"`` stores nothing and raises DuplicateContentError instead. Skipped:
        ``len(rows) - stored``.

        ``report=True`` returns a :class:`~expstore.StoreReport` instead: rows stored,
        skipped as duplicates, evicted by the write beyond the capacity and as stale, and
        how many of the batch's own rows that eviction took at once (a group of a policy
        version already too old for eviction ``"stale"`` is stored and evicted in the same
        transaction: ``stored=8, evicted_stale=8, evicted_at_once=8, kept=0``; its rows
        leave tombstones, so :meth:`lineage` says ``evicted``)::

            done = buffer.store_batch(group, report=True)
            if done.kept < done.stored:
                log.warning("%d rows evicted at once", done.evicted_at_once)
        """
        if check_flag("report", report):
            return self.sql.store_batch(rows, dedup=dedup, report=True)
        return self.storage.store_batch(rows, dedup=dedup)

    @overload
    def extend(
        self, columns: Mapping[str, Any], *, dedup: Dedup = None, report: Literal[False] = False
    ) -> int: ...

    @overload
    def extend(
        self, columns: Mapping[str, Any], *, dedup: Dedup = None, report: Literal[True]
    ) -> StoreReport: ...

    def extend(
        self, columns: Mapping[str, Any], *, dedup: Dedup = None, report: bool = False
    ) -> int | StoreReport:
        """Store a batch given as columns, in one transaction, as TorchRL's ``extend``::

            buffer.extend({
                "task_id": [f"env{i}" for i in range(n)], "agent_id": "policy-7",
                "step": t, "state": {"obs": obs},          # obs: array [n, ...]
                "actions": actions, "reward_t": rewards, "done": dones,
            })

        A column is a sequence, an array or tensor whose first axis is the rows, a dict of
        those (per-row dicts), or one plain value for every row; ``task_id``, ``agent_id``
        and ``step`` are required, ``id`` optional. Checked like ``store_batch`` (a bad value
        names its column and row), with the same retention, ``dedup`` and rate limit; returns
        how many rows were stored (``report=True``: a :class:`~expstore.StoreReport`, as
        :meth:`store_batch`). See :mod:`expstore.model.columnar`."""
        if check_flag("report", report):
            return self.sql.extend(columns, dedup=dedup, report=True)
        return self.storage.extend(columns, dedup=dedup)

    def delete(self, query_condition: QueryCondition) -> int:
        """Delete the matching rows; returns how many went."""
        return self.storage.delete(query_condition)

    def clear(self) -> None:
        """Delete every row of this buffer."""
        self.storage.clear()

    # -- reading -------------------------------------------------------------------------
    def get(self, row_id: str) -> DataRow | None:
        """The row with this id, or None."""
        return self.storage.get(row_id)

    def count(self, query_condition: QueryCondition = None) -> int:
        """How many rows match (all rows for None)."""
        return self.storage.count(query_condition)

    def __len__(self) -> int:
        return self.storage.count()

    def query(
        self,
        query_condition: QueryCondition = None,
        *,
        limit: int | None = None,
        offset: int = 0,
        order_by: str = "key",
    ) -> Iterator[DataRow]:
        """Stream the matching rows (insertion order by default; ``"-key"`` newest first),
        from the ``offset``-th, at most ``limit`` (None: all). For browsing page after page,
        :meth:`page` costs the same on every page; an offset walks the rows it skips."""
        return self.storage.query(query_condition, limit=limit, offset=offset, order_by=order_by)

    def page(
        self,
        query_condition: QueryCondition = None,
        *,
        after: str | None = None,
        limit: int = 50,
        order_by: str = "key",
    ) -> RowsPage:
        """One page of the matching rows, for browsing: up to ``limit`` (at most 10,000)
        in ``order_by`` order (as :meth:`query`), after the cursor ``after`` a previous
        page gave (None: the first page). Returns ``RowsPage(rows, next, keys)``: ``next``
        is the cursor of the following page (None after the last). Pages are found by
        keyset, so the millionth page costs what the first does."""
        return self.sql.rows_after(query_condition, after=after, limit=limit, order_by=order_by)

    def get_by_task_id(self, task_id: str) -> list[DataRow]:
        """Every row of one task, ordered by step, then execute_time."""
        return self.storage.get_by_task_id(task_id)

    def get_batch_by_task_ids(self, task_ids: Iterable[str]) -> dict[str, list[DataRow]]:
        """Every row of each task, grouped by task id."""
        return self.storage.get_batch_by_task_ids(task_ids)

    def task_ids(self, query_condition: QueryCondition = None) -> list[str]:
        """Distinct task ids with at least one matching row, in order of first insertion."""
        return self.storage.task_ids(query_condition)

    def create_index(self, path: str) -> bool:
        """Index the database's rows on a payload path (``"exp_data.state.difficulty"``) or
        a column, so conditions on it (equality, ``in``, number comparisons) are index
        ranges instead of scans; whether it was made now. Safe to call again (nothing
        happens: False); Postgres builds it without stopping writers. Kept across upgrades,
        and serves every buffer of the database (see :mod:`expstore.db.path_indexes`)."""
        return self.sql.create_index(path)

    def indexes(self) -> dict[str, str]:
        """The path indexes of the buffer's database (:meth:`create_index`), ``{path: index
        name}``, sorted by path."""
        return self.sql.indexes()

    def drop_index(self, path: str) -> bool:
        """Drop the index :meth:`create_index` made on ``path``; whether there was one."""
        return self.sql.drop_index(path)

    def track_changes(self, path: str) -> bool:
        """Track whether the value at ``path`` (``"exp_data.state.screenshot"``, or a
        column) equals the previous and the next step's of each trajectory, so that
        ``changed(path)`` and ``unchanged(path)`` cost about what an indexed filter costs
        instead of a probe per row, and small arrays (kept in their rows' blobs) compare by
        value too. Every write and removal keeps the flags, in its transaction; the rows
        stored now are done in one transaction. Kept in the database for every handle of
        the buffer; returns whether the path was not tracked already (see
        :mod:`expstore.tracking.changes`)."""
        return self.sql.track_changes(path)

    def untrack_changes(self, path: str) -> bool:
        """Stop tracking ``path`` (:meth:`track_changes`); whether it was tracked."""
        return self.sql.untrack_changes(path)

    def tracked_changes(self) -> list[str]:
        """The paths whose changes the buffer tracks (:meth:`track_changes`), sorted."""
        return self.sql.tracked_changes()

    def create_summary(
        self, *, step: int = 200_000, progress: Callable[[int], object] | None = None
    ) -> bool:
        """Keep a summary row per task, updated by every write and delete in its own
        transaction, so that ``expstore stats`` (and :func:`expstore.cli.stats.compute_stats`
        without a condition) reads one row per task instead of every row: about a second
        instead of half a minute at 10M rows. Writes pay for it (a few statements each,
        +4 to +9 ms for a 64-row write that evicts; see benchmarks/RESULTS.md). The rows
        present are summarised ``step`` at a time, each step in a transaction of its own,
        so writers never wait long (``progress``, if given, is told how many rows each
        step summarised). A long task (over 1,000 rows) whose extremes a delete took is
        read from its rows by stats until this is called again, which summarises it anew.
        Kept with the buffer for every process; safe to call again (a build cut short
        goes on). Returns whether there was anything to build (False: the buffer kept them,
        built, already). See :mod:`expstore.stats.task_stats`."""
        return self.sql.create_summary(step=step, progress=progress)

    def drop_summary(self) -> bool:
        """Stop keeping task summaries (:meth:`create_summary`); whether there were any."""
        return self.sql.drop_summary()

    def summary_state(self) -> SummaryState | None:
        """Whether the buffer keeps task summaries (:meth:`create_summary`) and how far
        they are built (``since``, ``through``, ``.built``); None when it keeps none."""
        return self.sql.summary_state()

    def to_arrow(
        self, query_condition: QueryCondition = None, *, images: str | Sequence[str] | None = None
    ) -> Any:
        """The matching rows as a ``pyarrow.Table`` (``pip install 'expstore[parquet]'``):
        the export's columns (every bit in ``data`` and ``tensors``, see docs/format.md),
        each array or tensor path as a fixed-size-list column ``tensor.<path>``, and
        ``execute_time_us`` (microseconds since the epoch, int64). ``images="auto"`` or
        field paths make uint8 image arrays Hugging Face ``Image`` columns ``image.<path>``
        (PNG bytes; needs ``expstore[images]``) instead. See :mod:`expstore.model.arrow`."""

        return to_arrow(self, query_condition, images=images)

    def to_minari(
        self, dataset_id: str, query_condition: QueryCondition = None, **options: Any
    ) -> Any:
        """The matching rows as the Minari dataset ``dataset_id`` (episodes are tasks, steps
        are rows), streamed; returns the ``minari.MinariDataset`` (``pip install
        'expstore[minari]'``). ``options``: those of :func:`expstore.export_minari`
        (spaces, env, fields, root, overwrite, Minari's metadata)."""
        return export_minari(self, dataset_id, query_condition, **options)

    def to_pandas(
        self, query_condition: QueryCondition = None, *, images: str | Sequence[str] | None = None
    ) -> Any:
        """:meth:`to_arrow` as a pandas DataFrame: array columns hold numpy arrays, image
        columns ``{"bytes": <PNG>, "path": None}`` dicts."""
        return self.to_arrow(query_condition, images=images).to_pandas()

    def update_priorities(
        self, ids: Sequence[str], priorities: Sequence[float] | np.ndarray
    ) -> int:
        """Set stored priorities (for PrioritizedSampler) by row id; returns rows updated."""
        return self.storage.update_priorities(ids, priorities)

    def set_retention(
        self,
        capacity: int | None,
        eviction: Eviction | None = None,
        *,
        stale_after: int | None = None,
        tombstones: int | None = None,
    ) -> int:
        """Change this buffer's capacity (None: unlimited) and eviction policy (None: keep
        it) for every process that writes to it; rows beyond the new capacity go now.
        ``eviction="stale"`` drops rows more than ``stale_after`` policy versions behind
        the current one at every write and version change (then the oldest beyond
        ``capacity``); a stale row a claim holds under a live lease stays until its ack
        (which evicts it) or until the lease runs out. Returns how many rows went.

        Every row that goes (evicted, or deleted) leaves a tombstone, so :meth:`lineage`
        still answers for it; ``tombstones`` is how many the buffer keeps, the newest
        (default 100,000; 0: none; None: keep the setting). See
        :mod:`expstore.retention.tombstones`."""
        return self.storage.set_retention(
            capacity, eviction, stale_after=stale_after, tombstones=tombstones
        )

    def retention(self) -> RetentionSetting:
        """The buffer's retention as every writer reads it: ``capacity``, ``eviction``,
        ``stale_after`` (the ``"stale"`` policy's k) and ``tombstones`` (how many it keeps);
        what :meth:`set_retention` sets."""
        return self.storage.retention()

    def set_compression(
        self,
        compression: str | None = "auto",
        *,
        max_array_bytes: int | None = None,
        fields: Mapping[str, str | None] | None = None,
    ) -> None:
        """Set how this buffer compresses the arrays it stores by digest (each array of
        64 KiB or more is stored once per buffer, however many rows hold it) for every
        process that writes to it: ``"auto"`` (the default: zstd, PNG for photo-like
        images when it is much smaller), ``"zstd"``, ``"png"`` or ``"webp"`` (lossless,
        for uint8 images; zstd for other arrays; needs ``expstore[images]``) or None (raw).
        ``max_array_bytes`` refuses larger arrays at store time (default 512 MiB; None: keep
        the setting). ``compression`` is always set (a call with ``fields`` alone sets it
        to ``"auto"``: pass the buffer's own to keep it). ``fields`` sets the compression of
        the arrays under payload paths over that, the most specific path winning:
        ``{"exp_data.state.screenshot": "png", "exp_data.state.noise": None}`` (a codec of
        None stores that path's arrays raw). ``fields=None`` keeps the paths set and
        ``fields={}`` drops them.
        Rows stored before stay as they are, readable. See
        :mod:`expstore.codec.compression`."""
        self.storage.set_compression(compression, max_array_bytes=max_array_bytes, fields=fields)

    def compression(self) -> ArraySetting:
        """The buffer's setting for arrays stored by digest, as every writer reads it:
        ``compression``, ``max_array_bytes`` and ``fields`` (per payload path); what
        :meth:`set_compression` sets."""
        return self.storage.compression()

    def array_stats(self) -> tuple[int, int, int]:
        """(arrays stored by digest, their own bytes, their stored bytes) of this buffer."""
        return self.storage.array_stats()

    # -- policy versions (expstore.policy_versions) -------------------------------------
    def set_policy_version(self, version: int, *, force: bool = False) -> int:
        """Publish the trainer's current policy version to every process sharing the
        buffer. Rows stamped with ``ExpMeta.policy_version`` older than ``version - k`` are
        then left out by samplers and claims given ``max_staleness=k`` (and deleted, with
        eviction ``"stale"``, in this same transaction: returns how many). Going backwards
        raises PolicyVersionError unless ``force=True``."""
        return self.storage.set_policy_version(version, force=force)

    def policy_version(self) -> int | None:
        """The buffer's current policy version, as every process sees it (None: never set)."""
        return self.storage.policy_version()

    # -- sampling ------------------------------------------------------------------------
    @overload
    def sample(
        self,
        sampler: Sampler | None = None,
        query_condition: QueryCondition = None,
        converter: None = None,
        batch_size: int = 1000,
    ) -> list[DataRow]: ...

    @overload
    def sample(
        self,
        sampler: Sampler | None,
        query_condition: QueryCondition,
        converter: Converter[BatchT],
        batch_size: int = 1000,
    ) -> BatchT: ...

    @overload
    def sample(
        self,
        sampler: Sampler | None = None,
        query_condition: QueryCondition = None,
        *,
        converter: Converter[BatchT],
        batch_size: int = 1000,
    ) -> BatchT: ...

    def sample(
        self,
        sampler: Any = None,
        query_condition: QueryCondition = None,
        converter: Any = None,
        batch_size: int = 1000,
    ) -> Any:
        """A batch: ``sampler`` chooses up to ``batch_size`` matching rows, the storage
        fetches what ``converter`` reads (whole rows, or only its fields), and ``converter``
        builds the batch (see :mod:`expstore.samplers.loop`).

        Defaults: ``UniformSampler()`` (with replacement) and ``DefaultConverter()`` (the
        rows as a list). When the sampler weighs rows and the converter builds a dict, the
        batch also has ``"weights"`` (importance-sampling weights) and ``"ids"`` (for
        :meth:`update_priorities`); ``sampler.last_info`` has them whatever the converter.
        AWorld-style samplers and converters (with only ``sample`` or ``to_dataset_row``)
        work too. No matching row raises EmptyBufferError. ::

            per = PrioritizedSampler(seed=0)
            conv = TensorConverter({"obs": "exp_data.state.obs", "r": "exp_data.reward_t"})
            batch = buffer.sample(per, converter=conv, batch_size=256)
            loss = (batch["weights"] * td_error(batch) ** 2).mean()
            buffer.update_priorities(batch["ids"], td_error(batch).abs().detach().numpy())
        """
        chooser = as_sampler(UniformSampler() if sampler is None else sampler)
        builder = as_converter(DefaultConverter() if converter is None else converter)
        # The one loop (see expstore.samplers.loop): choose, fetch what the converter reads,
        # choose again for rows deleted meanwhile, describe; then build and attach.
        fetched, info = draw(
            self.storage,
            chooser,
            batch_size,
            query_condition,
            builder.paths,
            writable=not builder.copies_arrays,
        )
        return builder.attach_info(builder.build(fetched), info)

    def batches(
        self,
        sampler: Any = None,
        query_condition: QueryCondition = None,
        converter: Any = None,
        batch_size: int = 1000,
        *,
        prefetch: int = 2,
        num_batches: int | None = None,
    ) -> Prefetcher[Any]:
        """Batches as :meth:`sample` makes them, ``num_batches`` of them (None: endless),
        made ahead in a background thread while the caller trains on the last one
        (TorchRL's ``prefetch``): ``prefetch`` waiting and one being made (0: each made
        when asked). ::

            with buffer.batches(per, converter=conv, batch_size=256, prefetch=2) as stream:
                for batch in stream:
                    loss = train_step(batch)

        The batches are those :meth:`sample` would give called in a loop (a seeded sampler
        gives the same ones). ``stream.last_info`` describes the batch last handed out (its
        keys, ids and importance weights): while the stream runs, ``sampler.last_info`` is
        the thread's, of a batch made ahead (a dict converter's batch carries its own
        ``weights`` and ``ids``). An error (EmptyBufferError, a lost database) is raised
        at the batch it belongs to and ends the stream. A batch made ahead was chosen
        before what the caller did meanwhile (a priority update, a delete) reached the
        database, as in TorchRL; the sampler must not be used elsewhere while the stream
        runs. A sampler with ``consume_after`` is refused (dropped batches would spend
        rows).
        ``close()`` (or the ``with`` block's end) stops the thread: batches made ahead
        are dropped, their rate-limit count given back and the sampler's epoch rewound
        to the first of them. ``stream.waited_s`` is the time the caller waited."""
        chooser = as_sampler(UniformSampler() if sampler is None else sampler)
        builder = as_converter(DefaultConverter() if converter is None else converter)
        check_batch_size(batch_size)
        if prefetch and chooser.consume_after is not None:
            raise InvalidArgumentError(
                f"a sampler with consume_after={chooser.consume_after} counts each row's "
                "draws as its batch is made, so batches made ahead and then dropped would "
                "spend rows no one got: use prefetch=0 (or claims, which give rows back)"
            )
        storage = self.storage

        def make() -> tuple[Any, SampleInfo | None]:
            batch = self.sample(chooser, query_condition, builder, batch_size)
            return batch, chooser.last_info

        def deliver(item: tuple[Any, SampleInfo | None]) -> tuple[Any, SampleInfo | None]:
            return item  # the batch, and its info as the stream's last_info

        def discard(item: tuple[Any, SampleInfo | None]) -> None:
            info = item[1]
            if info is not None and len(info.ids) and storage.sampling_limited():
                storage.refund_samples(len(info.ids))  # the rate limit's count goes back

        hooks: Hooks[tuple[Any, SampleInfo | None]] = Hooks(
            mark=chooser.mark, rewind=chooser.rewind, discard=discard, deliver=deliver
        )
        return Prefetcher(make, prefetch=prefetch, num_batches=num_batches, hooks=hooks)

    def sample_task(
        self,
        sampler: TaskSampler | None = None,
        query_condition: QueryCondition = None,
        converter: Converter[Any] | None = None,
        batch_size: int = 1000,
    ) -> list[Any]:
        """Whole tasks: one converted item per sampled task (up to ``batch_size`` tasks).

        The condition chooses the tasks (those with at least one matching row); every row
        of a chosen task comes back, ordered by step, then execute_time. Defaults:
        ``RandomTaskSampler()`` and ``DefaultConverter()`` (each item a list of rows). No
        matching row raises EmptyBufferError.
        """
        chooser = as_sampler(RandomTaskSampler() if sampler is None else sampler)
        converter = DefaultConverter() if converter is None else converter
        # The one loop, as sample() draws (a rate limit counts the rows, the row cache
        # serves them), cut at the tasks.
        tasks = draw_tasks(self.storage, chooser, batch_size, query_condition)
        return [converter.to_dataset_row(task_rows) for task_rows in tasks.values()]

    # -- claims: a consume-once queue for learners (expstore.claims) ---------------------
    def claim(
        self,
        batch_size: int,
        query_condition: QueryCondition = None,
        *,
        consumer: str,
        lease_s: float = DEFAULT_LEASE_S,
        order: Any = "oldest",
        converter: Converter[Any] | None = None,
        wait_s: float | None = None,
        max_staleness: int | None = None,
        min_batch_size: int | None = None,
    ) -> Claim:
        """Claim up to ``batch_size`` matching rows that no other consumer gets while the
        lease holds, for any process on any host sharing the database.

        ``order``: ``"oldest"`` (oldest first, the default), ``"random"``, or a sampler
        (``PrioritizedSampler`` ...) that picks among the claimable rows it could draw itself
        (its own ``max_staleness`` and conditions hold, the tighter staleness of the claim's
        and its own). ``converter`` builds ``claim.batch`` (the rows as a list by default);
        if it raises, the claim is released (and its samples refunded to a rate limit)
        before the error reaches you. ``wait_s``: seconds to wait for ``batch_size``
        claimable rows (without it the claim takes what there is now, maybe nothing); if
        none came, WaitTimeoutError saying what actors and learners are doing.
        ``min_batch_size`` (with ``wait_s``): return as soon as ``min_batch_size`` rows are
        claimable, taking up to ``batch_size`` (Kafka's ``fetch.min.bytes`` with
        ``fetch.max.wait.ms``); WaitTimeoutError, with nothing claimed, if fewer are by
        then. For group claims both count rows of whole groups (multiples of
        ``group_size``). Finish with ``claim.ack(checkpoint=...)`` or ``claim.release()``; a
        claim neither acked nor released goes back to the queue when its lease runs out.
        ``max_staleness``: only rows no more than that many policy versions behind the
        buffer's current version (see :meth:`set_policy_version`), checked in the claim's
        own statements. Once ``consumer`` has been opened with :meth:`consumer`
        (generations), a plain claim under its name raises FencedError: claim through the
        Consumer. For example ``buffer.claim(256, consumer="learner-0", wait_s=30,
        min_batch_size=64)``.
        """
        return claim_rows(
            self.sql,
            batch_size,
            query_condition,
            consumer=consumer,
            lease_s=lease_s,
            order=order,
            converter=converter,
            wait_s=wait_s,
            max_staleness=max_staleness,
            min_batch_size=min_batch_size,
        )

    # -- prompt queues (expstore.claims.prompts) ----------------------------------
    def store_prompts(
        self, prompts: Sequence[DataRow], *, group_size: int | Sequence[int], parts: int = 1
    ) -> StoreReport:
        """Store prompts (tasks) for actors to claim, each with a completion target:
        ``group_size`` (one number for all, or one per prompt) completions. A prompt stays
        claimable until acks that store its completions
        (``claim.ack(produce={row_id: completions}, into=rollouts)``) reach its target;
        ``claim.needs`` says how many it still needs.

        Two shapes: ``parts=1`` (the default), one actor generates a prompt's whole
        group, and an ack with fewer completions (some failed) releases the prompt for
        the rest; ``parts=k``, the prompt is stored as ``k`` rows (ids ``<id>#0`` ...
        ``<id>#<k-1>``, the same task and metadata), each with its share of
        ``group_size``, so ``k`` actors generate parts of one group at once (group the
        completions by the prompt's ``task_id``). All or nothing, in one transaction;
        returns a StoreReport."""
        return store_prompts(self.sql, prompts, group_size, parts)

    def set_admission(
        self,
        into: ReplayBuffer | None,
        *,
        batch_size: int | None = None,
        max_batches_ahead: int | None = None,
        max_backlog: int | None = None,
        timeout_s: float | None = 60.0,
    ) -> None:
        """Bound how far actors claiming this buffer's prompts run ahead of the learners
        consuming ``into`` (the rollouts buffer, in the same database), as AReaL's
        staleness control: a claim of prompts waits while the completions in flight (what
        the live prompt claims still need) plus those stored in ``into`` and not yet
        consumed (acked by a claim) reach ``(max_batches_ahead + 1) * batch_size`` (AReaL's
        ``max_head_offpolicyness`` η: how many learner batches generation may run ahead), or while
        the stored ones reach ``max_backlog``. The counts are the database's, the same
        for every actor on every host and after restarts. A claim waits up to its
        ``wait_s=`` (else ``timeout_s`` seconds; None: as long as it takes), then raises
        AdmissionTimeoutError naming the bound. ``into=None`` removes the bound."""
        set_admission(
            self.sql,
            into,
            batch_size=batch_size,
            max_batches_ahead=max_batches_ahead,
            max_backlog=max_backlog,
            timeout_s=timeout_s,
        )

    def admission(self) -> Admission | None:
        """The buffer's admission bound as :meth:`set_admission` set it (``into``: the
        rollouts buffer's name, ``batch_size``, ``max_batches_ahead``, ``max_backlog``,
        ``timeout_s``); None without a bound. The counts it sees: :meth:`admission_stats`."""
        return admission_setting(self.sql)

    def admission_stats(self) -> AdmissionState | None:
        """The admission counts now (completions in flight, stored unconsumed, the bounds,
        the room left, which bound holds claims back); None without a bound."""
        return admission_now(self.sql)

    def consumer(self, name: str, *, takeover: bool = False) -> Consumer:
        """Open a new incarnation of consumer ``name`` (a learner, the same name across its
        restarts): one transaction bumps the name's generation and returns a
        :class:`~expstore.claims.Consumer` holding it. From then on every claim, ack,
        release, renewal and checkpoint of an older incarnation raises FencedError and
        changes nothing (ZooKeeper's fencing tokens, Kafka's producer epochs), including
        plain ``claim(consumer=name)`` calls and their claims. ``takeover=True`` also
        releases the claims the predecessors still hold, in the same transaction, so their
        rows (and whole groups) are claimable at once instead of after their lease::

            learner = buffer.consumer("learner-0", takeover=True)
            claim = learner.claim(256, wait_s=30)
            with learner.step() as step:       # acks, checkpoint, version: one commit
                step.ack(claim)
                step.save_checkpoint({"step": 1})
        """
        name = check_consumer(name)
        if not isinstance(takeover, bool):
            raise UnsupportedTypeError(f"takeover must be True or False, got {takeover!r}")
        sql = self.sql
        generation, taken = queue_of(sql.handle).open_consumer(name, takeover=takeover)
        if taken and sql.sampling_limited():
            # Rows the predecessors' claims counted as sampled go back to the queue
            # unconsumed: their samples go back to the rate limit (counted again when
            # claimed again), or a consume-once queue would lose budget at every restart.
            sql.rate_limits.refund(taken, current=True)
        return Consumer(sql, name, generation, taken)

    def checkpoint(self, consumer: str, default: Any = ...) -> Any:
        """The checkpoint ``consumer`` last acked with; ``default`` if it has none (without
        ``default``: UnknownConsumerError)."""
        check_consumer(consumer)
        try:
            return queue_of(self.sql.handle).checkpoint(consumer)[1]
        except UnknownConsumerError:
            if default is ...:
                raise
            return default

    def wait_for(
        self,
        min_rows: int,
        query_condition: QueryCondition = None,
        *,
        timeout_s: float | None = None,
        claimable: bool = False,
        max_staleness: int | None = None,
    ) -> int:
        """Block until at least ``min_rows`` rows match (``claimable=True``: can be claimed
        now), polling with back-off (5 ms growing to 0.5 s); returns how many were seen
        (counting stops at ``min_rows``). WaitTimeoutError after ``timeout_s`` seconds."""
        return wait_for_rows(
            self.sql,
            min_rows,
            query_condition,
            timeout_s=timeout_s,
            claimable=claimable,
            max_staleness=max_staleness,
        )

    def ready_groups(
        self,
        sampler: GroupSampler,
        query_condition: QueryCondition = None,
        *,
        max_staleness: int | None = None,
    ) -> GroupTally:
        """How the groups a claim with ``order=sampler`` (and this condition and
        ``max_staleness``) takes from stand now: ``ready`` (whole groups claimable now),
        ``held`` (claimed, not acked yet), ``waiting`` (fewer rows than the group size),
        ``filtered`` and ``stale`` (left out for good). Consumed groups are not counted.
        Costs what changed since the last claim or count, like a claim."""
        return count_ready_groups(self.sql, sampler, query_condition, max_staleness)

    def lineage(self, ids: Sequence[str]) -> dict[str, Lineage]:
        """Each row's consumption record: state (unclaimed, leased, expired, consumed),
        consumer, when claimed and acked, the checkpoint it was acked with, how many times
        it was claimed. A row no longer stored whose tombstone the buffer keeps (see
        :meth:`set_retention`) is ``evicted``: ``evicted_at``, ``evicted_by``
        (``capacity``, ``stale``, ``delete``, ``clear``), ``eviction_policy``, and its
        consumption record as it was when it went (acked by whom, when, with which
        checkpoint). Other ids are left out."""
        return queue_of(self.sql.handle).lineage(ids)

    def queue_stats(self, query_condition: QueryCondition = None) -> QueueStats:
        """Queue depth over the matching rows: unclaimed, leased, expired, consumed, and
        per consumer."""
        return queue_of(self.sql.handle).stats(query_condition)

    # -- rate limits (expstore.limits.rate_limiter) ----------------------------------------
    def set_rate_limiter(self, limiter: RateLimiter | None) -> None:
        """Limit sampling (and, with ``block_writers``, writing) of this buffer for every
        process, as Reverb's rate limiters: ``RateLimiter(min_size=..., samples_per_insert=
        ..., error_buffer=...)``; None removes the limit. Setting the limit the buffer
        already has keeps its counters, so a restarted trainer resumes its budget."""
        self.sql.rate_limits.set(limiter)

    def rate_limiter(self) -> RateLimiter | None:
        """The buffer's rate limit (None: none)."""
        return self.sql.rate_limits.limiter()

    def rate_limit_stats(self) -> RateLimitStats | None:
        """What the rate limit counted (inserted, sampled) and whether a sample or a write
        could go now; None without a limit."""
        return self.sql.rate_limits.stats()

    def cache_stats(self) -> CacheStats:
        """What this handle's decoded-row cache holds and how it has served: budget, bytes
        and rows held, hits, misses, evictions (``.hit_rate``); a budget of 0 when the
        storage has no cache (see ``cache_bytes``)."""
        sql = self.storage
        if not isinstance(sql, SqlStorage):
            return CacheStats(0, 0, 0, 0, 0, 0, 0)
        return sql.row_cache.stats()

    # -- lifecycle -----------------------------------------------------------------------
    def close(self) -> None:
        """Release the storage's connections."""
        self.storage.close()

    def __enter__(self) -> ReplayBuffer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ReplayBuffer({self.storage!r})"

    def __reduce__(self) -> Any:
        return (ReplayBuffer, (self.storage,))
