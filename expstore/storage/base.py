"""The storage interfaces: what a backend must do.

- :class:`Storage`: where rows live and how they come back (store, get, count, query,
  fetch), and what the sampling loop needs of the buffer beside its rows: its policy
  version (``max_staleness``), its draw counts (``consume_after``), its rate limit's
  sample counts, its priorities, its retention and its group summaries.
- :class:`KeySpace`: the key primitives a draw over the buffer's keys uses without holding
  them (the key range and counts, probes of candidate keys, distinct values, the first
  matching row of a value, aggregates, the rows of given values or ranges), on which every
  sampler builds its choice (see :mod:`expstore.samplers.flat`).
- :class:`Kept`: what draws find about their matching rows, kept from draw to draw.

:class:`~expstore.storage.sql.SqlStorage` and its
:class:`~expstore.storage.key_space.SqlKeySpace` implement them over SQLite and Postgres;
what only a SQL database keeps (claims, rate-limit settings, path indexes, task summaries,
policy versions set for every process) is :class:`~expstore.storage.sql.SqlStorage`'s own,
and the buffer reaches it there (see :class:`expstore.ReplayBuffer`).

AWorld 0.2.7's storage names (``add``, ``add_batch``, ``size``, ``get_paginated``,
``get_all``, ``get_bacth_by_task_ids``) are not expstore's: they live in
:mod:`expstore.integrations.aworld_replay`. Sampling goes through :meth:`Storage.key_index`
(the matching rows' integer keys and a few columns as arrays, which samplers choose from)
and :meth:`Storage.fetch` (the chosen rows, whole or only the fields a converter reads).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import numpy as np

from ..arrays.stored_once import ArraySetting
from ..errors import InvalidArgumentError
from ..lifecycle.reader_state import Signature, moved_on
from ..limits.reservation import Reservation
from ..model.rows import DataRow
from ..policy_versions import oldest_fresh
from ..query import QueryCondition, condition_key

if TYPE_CHECKING:
    from ..dedup import Dedup
    from ..group_summaries import GroupSpec
    from ..retention.capacity import RetentionSetting
    from ..retention.eviction import Eviction


__all__ = [
    "Arrays",
    "Fetched",
    "KeySpace",
    "Kept",
    "PriorityBounds",
    "QueryCondition",
    "Since",
    "Storage",
    "Values",
]

_T = TypeVar("_T")

#: One path's values over a batch of rows: a list, or an array whose first axis is the rows.
Values = list[Any] | np.ndarray
#: Rows as a key index gives them: ``"key"`` (int64, ascending) and columns, aligned.
Arrays = dict[str, np.ndarray]


class Fetched(NamedTuple):
    """Chosen rows as :meth:`Storage.fetch` gives them: the ids of the rows found, in the
    order asked (repeats kept, rows deleted since they were chosen left out), and either
    the whole rows or, when paths were asked for, each path's values over those rows."""

    ids: list[str]
    rows: list[DataRow] | None = None
    columns: list[Values] | None = None


class Storage(ABC):
    """Holds rows of one named buffer and fetches them back."""

    #: The buffer's retention as this handle last saw it (None: unlimited; see
    #: :meth:`set_retention`).
    capacity: int | None = None
    eviction: str = "fifo"

    #: The buffer's name in its database.
    name: str

    @property
    @abstractmethod
    def url(self) -> Any:
        """Where the rows live (a SQLAlchemy URL for SQL storages)."""

    @property
    def identity(self) -> tuple[Any, ...]:
        """Which buffer this handle reads, as it last saw it: samplers forget what they
        hold of a buffer (an epoch's progress, the rows known spent) when they are next
        used with another (see :meth:`~expstore.samplers.base.KeySampler.forget_buffer`).
        The last item tells one incarnation of a buffer from another (a database made
        anew); None where a storage cannot tell."""
        return (str(self.url), getattr(self, "name", None), None)

    # -- writing -------------------------------------------------------------------------
    @abstractmethod
    def store_batch(self, rows: Sequence[DataRow], *, dedup: Dedup = None) -> int:
        """Store every row, or none of them; returns how many were stored (fewer with
        ``dedup="skip"``: rows whose content was already stored are left out)."""

    def store(self, row: DataRow, *, dedup: Dedup = None) -> int:
        """Store one row; returns 1, or 0 if ``dedup="skip"`` left it out."""
        if row is None:
            raise InvalidArgumentError("store() needs a DataRow, got None")
        return self.store_batch([row], dedup=dedup)

    def extend(self, columns: Mapping[str, Any], *, dedup: Dedup = None) -> int:
        """Store the rows a dict of columns holds, in one transaction (see
        :mod:`expstore.model.columnar`); returns how many were stored. This default builds a
        DataRow per row; a SQL storage hands the columns' rows to its writer directly."""
        from ..model.columnar import rows_from_columns
        from ..model.rows import Experience, ExpMeta

        rows = [
            DataRow(
                id=r.id,
                exp_meta=ExpMeta(**r.exp_meta.__dict__),
                exp_data=Experience(**r.exp_data.__dict__),
            )
            for r in rows_from_columns(columns)
        ]
        return self.store_batch(rows, dedup=dedup)

    @abstractmethod
    def delete(self, query_condition: QueryCondition) -> int:
        """Delete the matching rows; returns how many went."""

    @abstractmethod
    def clear(self) -> None:
        """Delete every row of this buffer."""

    @abstractmethod
    def update_priorities(
        self, ids: Sequence[str], priorities: Sequence[float] | np.ndarray
    ) -> int:
        """Set stored priorities by row id; returns how many rows were updated."""

    @abstractmethod
    def set_retention(
        self,
        capacity: int | None,
        eviction: Eviction | None = None,
        *,
        stale_after: int | None = None,
        tombstones: int | None = None,
    ) -> int:
        """Change the buffer's capacity and eviction policy (and how many tombstones of
        rows gone it keeps) for every writer; returns how many rows went at once."""

    @abstractmethod
    def retention(self) -> RetentionSetting:
        """The buffer's capacity, eviction policy, the ``"stale"`` policy's k and how many
        tombstones it keeps, as every writer reads them."""

    @abstractmethod
    def set_compression(
        self,
        compression: str | None,
        *,
        max_array_bytes: int | None = None,
        fields: Mapping[str, str | None] | None = None,
    ) -> None:
        """Set how the buffer compresses arrays it stores by digest from now on
        (``"auto"``, ``"zstd"``, ``"png"``, ``"webp"`` or None), per payload path over that
        (``fields``; None: keep the setting, empty: none), and the largest array a row may
        hold (None: keep the setting), for every writer."""

    @abstractmethod
    def compression(self) -> ArraySetting:
        """The buffer's setting for arrays stored by digest, as every writer reads it."""

    @abstractmethod
    def array_stats(self) -> tuple[int, int, int]:
        """(arrays stored by digest, their own bytes, their stored bytes) of the buffer."""

    @abstractmethod
    def policy_version(self) -> int | None:
        """The buffer's current policy version (None: never set), which samplers with
        ``max_staleness`` measure rows against; see :mod:`expstore.policy_versions`."""

    @abstractmethod
    def set_policy_version(self, version: int, *, force: bool = False) -> int:
        """Publish ``version`` for every process; returns rows the "stale" eviction
        policy removed."""

    # -- reading -------------------------------------------------------------------------
    @abstractmethod
    def get(self, row_id: str) -> DataRow | None:
        """The row with this id, or None."""

    @abstractmethod
    def count(self, query_condition: QueryCondition = None) -> int:
        """How many rows match (all rows for None)."""

    @abstractmethod
    def query(
        self,
        query_condition: QueryCondition = None,
        *,
        limit: int | None = None,
        offset: int = 0,
        order_by: str = "key",
    ) -> Iterator[DataRow]:
        """Stream the matching rows in ``order_by`` order, from the ``offset``-th (0: the
        first), at most ``limit`` of them (None: all)."""

    @abstractmethod
    def get_by_task_id(self, task_id: str) -> list[DataRow]:
        """Every row of one task, ordered by step, then execute_time."""

    @abstractmethod
    def get_batch_by_task_ids(self, task_ids: Iterable[str]) -> dict[str, list[DataRow]]:
        """Every row of each task, grouped by task and ordered as in get_by_task_id."""

    @abstractmethod
    def task_ids(self, query_condition: QueryCondition = None) -> list[str]:
        """The distinct task ids with at least one matching row, in order of first insertion."""

    # -- sampling ------------------------------------------------------------------------
    def key_index(
        self, query_condition: QueryCondition = None, columns: Sequence[str] = ()
    ) -> dict[str, np.ndarray]:
        """The matching rows' integer keys (``"key"``, ascending) and ``columns`` as arrays."""
        return self.key_indexes([(query_condition, columns)])[0]

    @abstractmethod
    def key_indexes(
        self, requests: Sequence[tuple[QueryCondition, Sequence[str]]]
    ) -> list[dict[str, np.ndarray]]:
        """:meth:`key_index` for each ``(condition, columns)``, all at one moment."""

    @abstractmethod
    def key_space(
        self,
        query_condition: QueryCondition,
        use: Callable[[KeySpace], _T],
        *,
        max_staleness: int | None = None,
        consume_after: int | None = None,
        snapshot: bool = False,
    ) -> _T | None:
        """``use(space)`` over the buffer's :class:`KeySpace` read now, or None from a
        storage that cannot give one, whose samplers then choose over :meth:`key_index`.
        ``max_staleness``, ``consume_after``: the sampler's options of those names narrow
        the matching rows as the condition does. ``snapshot``: every statement of the draw
        reads one snapshot (for a draw whose statements must agree, e.g. priority bounds
        and probes)."""

    @abstractmethod
    def fetch_keys(self, keys: Sequence[int] | np.ndarray) -> list[DataRow]:
        """The rows with these keys, in the order given (repeats allowed, vanished keys
        skipped)."""

    @abstractmethod
    def fetch_columns(
        self, keys: Sequence[int] | np.ndarray, paths: Sequence[str], *, writable: bool = True
    ) -> tuple[list[str], list[Values]]:
        """The ids of the rows with these keys (as :meth:`fetch_keys` orders them) and the
        values at ``paths`` over them; ``writable=False`` allows read-only arrays."""

    def fetch(
        self,
        keys: Sequence[int] | np.ndarray,
        paths: Sequence[str] | None = None,
        *,
        writable: bool = True,
    ) -> Fetched:
        """The rows with these keys: whole (``paths=None``) or the values at ``paths``."""
        if paths is None:
            rows = self.fetch_keys(keys)
            return Fetched([row.id for row in rows], rows=rows)
        ids, columns = self.fetch_columns(keys, paths, writable=writable)
        return Fetched(ids, columns=columns)

    # -- what the sampling loop needs of the buffer beside its rows ----------------------
    @abstractmethod
    def count_draws(self, keys: np.ndarray, limit: int) -> np.ndarray:
        """For samplers with ``consume_after=limit``: count one draw of each of ``keys``
        (distinct) whose row has had fewer than ``limit``, for every process together, and
        return those keys (see :mod:`expstore.draw_counts`)."""

    @abstractmethod
    def spent_keys(self, limit: int, among: np.ndarray | None = None) -> np.ndarray:
        """The keys of rows drawn ``limit`` times or more by samplers with
        ``consume_after``, sorted; of ``among`` only if given."""

    @abstractmethod
    def acquire_samples(self, n: int, since: float | None = None) -> tuple[int, bool]:
        """Count ``n`` samples against the buffer's rate limit, waiting while it is spent;
        returns (samples counted, whether it waited); (0, False) for a buffer without a
        limit (see :mod:`expstore.limits.rate_limiter`)."""

    @abstractmethod
    def refund_samples(self, n: int) -> None:
        """Give back ``n`` counted samples that were not drawn."""

    def reserve_samples(self) -> Reservation:
        """A reservation of samples under the buffer's rate limit, counted by
        :meth:`acquire_samples` and given back by :meth:`refund_samples` in the part not
        used (see :mod:`expstore.limits.reservation`)."""
        return Reservation(self.acquire_samples, self.refund_samples)

    @abstractmethod
    def sampling_limited(self) -> bool:
        """Whether the buffer has a rate limit that counts samples (a read)."""

    @abstractmethod
    def groups(self, query_condition: QueryCondition, spec: GroupSpec) -> dict[str, Any]:
        """Summaries of the groups of matching rows, as arrays over the groups (see
        :meth:`expstore.group_summaries.GroupIndex.get`)."""

    @abstractmethod
    def close(self) -> None:
        """Release connections."""

    def __len__(self) -> int:
        return self.count()


class PriorityBounds(NamedTuple):
    """The smallest and largest stored priority of the whole buffer (None when none is
    stored)."""

    smallest: float | None
    largest: float | None


class KeySpace(ABC):
    """A buffer's keys as a draw sees them without holding them: the range its keys lie in
    and how many rows it holds, read in one round trip with its state, then probes of
    candidate keys and a few aggregates, all at one moment of the buffer as far as the
    backend's isolation gives. A sampler draws candidate keys in the range and asks
    :meth:`probe` which are rows matching the draw's condition, ``max_staleness`` and
    ``consume_after`` (rejection sampling, :mod:`expstore.samplers.flat`), so a draw's
    cost depends on the batch and the share of the range that matches, not on the
    buffer's size. Made by :meth:`Storage.key_space`."""

    #: The range the buffer's keys lie in (writers hand keys out in commit order and FIFO
    #: eviction removes the oldest) and how many rows it holds.
    min_key: int
    max_key: int
    rows: int
    #: The buffer's policy version, read with the range (None: never set).
    current_version: int | None
    #: What the draw narrows the rows to.
    query_condition: QueryCondition
    max_staleness: int | None
    consume_after: int | None
    #: The buffer's signature as this space read it (None: not known).
    signature: Signature | None
    #: What draws found about their matching rows, kept by the storage from draw to draw.
    kept: Kept
    #: Candidate keys (and rows) read through this space, to see what a draw cost.
    probed: int
    #: The matching rows' key index (``"key"``, ascending, and the columns read, aligned)
    #: when this space holds them in memory (a key index made a key space:
    #: :class:`~expstore.samplers.index_space.IndexKeySpace`); None for a space that probes
    #: the database. A draw over a listed space draws positions in it directly.
    listed: dict[str, Any] | None = None

    def remember(self, name: str, sources: tuple[np.ndarray, ...], compute: Callable[[], _T]) -> _T:
        """``compute()``, or the value kept for ``name`` while ``sources`` are the very same
        arrays (a listed space keeps what is derived from its arrays, e.g. a weighted draw's
        cumulative sum; a space over the database keeps nothing)."""
        return compute()

    # -- derived from the range ---------------------------------------------------------
    @property
    def span(self) -> int:
        """How many keys the range holds (0 for an empty buffer)."""
        return self.max_key - self.min_key + 1 if self.rows else 0

    @property
    def dense(self) -> bool:
        """Whether every key of the range is a row of the buffer (so a key's rank is its
        distance from ``min_key``); true of a buffer filled by its own writers alone and
        evicted oldest first."""
        return self.rows > 0 and self.rows == self.span

    @property
    def filtered(self) -> bool:
        """Whether only some of the buffer's rows match (a condition, max_staleness or
        consume_after)."""
        return (
            self.query_condition is not None
            or self.max_staleness is not None
            or self.consume_after is not None
        )

    @property
    def oldest(self) -> int | None:
        """The oldest fresh version under ``max_staleness`` (None: every row is fresh)."""
        return oldest_fresh(self.current_version, self.max_staleness)

    def condition_key(self) -> tuple[Any, ...]:
        """What the draws of this space take: its condition, ``max_staleness`` and
        ``consume_after``, as a hashable key."""
        return (condition_key(self.query_condition), self.max_staleness, self.consume_after)

    @property
    def candidates(self) -> tuple[int, int]:
        """The range candidate keys are drawn from, :attr:`low` included, ``high`` not
        (empty when no row can match)."""
        low = self.low
        high = max(low, self.max_key + 1) if self.rows else low
        return low, high

    # -- freshness -----------------------------------------------------------------------
    @property
    @abstractmethod
    def low(self) -> int:
        """The smallest key a matching row can have: ``min_key``, raised under
        ``max_staleness`` to the first fresh row's key, so that draws in a buffer whose
        older versions went stale look among its fresh rows alone; may exceed
        ``max_key`` when no row can match."""

    @property
    @abstractmethod
    def every_key_matches(self) -> bool:
        """Whether every key from :attr:`low` to ``max_key`` is a matching row, so a draw
        needs no probe."""

    @abstractmethod
    def late_stale_keys(self, limit: int) -> np.ndarray | None:
        """The keys from :attr:`low` on of stale rows (late rollouts of older policies
        among the fresh ones), sorted; None when there are more than ``limit``. Empty
        without ``max_staleness``."""

    # -- probes --------------------------------------------------------------------------
    @abstractmethod
    def probe(self, keys: np.ndarray, columns: Sequence[str] = ()) -> Arrays:
        """Of the candidate ``keys``, those that are rows of the buffer matching the draw
        (``"key"``, ascending, each once) and their ``columns``, as the key index gives
        them."""

    @abstractmethod
    def distinct(self, name: str) -> list[Any] | None:
        """The distinct values of the indexed column ``name`` among the buffer's rows;
        None when they cannot be listed cheaply (no index leads with it, it may be NULL, or
        it holds too many)."""

    @abstractmethod
    def first_matching(self, name: str, value: Any, start: int) -> int | None:
        """The key of the first matching row holding ``value`` in the indexed column
        ``name`` from key ``start`` on; None when there is none."""

    @abstractmethod
    def count_by(self, name: str, values: Sequence[Any]) -> dict[Any, int]:
        """How many matching rows hold each of ``values`` in the indexed column ``name``
        (values without a matching row left out)."""

    @abstractmethod
    def rows_of(self, name: str, values: Sequence[Any], order_by: Sequence[str]) -> np.ndarray:
        """The keys of every row of the buffer (the draw's narrowing aside) holding one of
        ``values`` in the indexed column ``name``, value by value in the given order, each
        value's rows ordered by ``order_by`` and then by key."""

    @abstractmethod
    def in_ranges(
        self,
        columns: Sequence[str],
        ranged: str,
        spans: Sequence[tuple[tuple[Any, ...], Any, Any]],
    ) -> list[tuple[Any, ...]]:
        """The matching rows of these spans, each the values of ``columns`` and a range of
        the column ``ranged`` (``low`` and ``high`` both included), as ``(*values of
        columns, value of ranged, key)`` in no particular order."""

    # -- runs: consecutive steps of one trajectory ----------------------------------------
    # The matching rows of a trajectory (one value of each of ``columns``), in order of
    # ``ordered`` (the step) then key, cut into runs wherever ``ordered`` does not go up by
    # exactly 1 (a missing step, a repeated one). A window of ``length`` is ``length``
    # rows in a row of one run, found by its first row.
    @abstractmethod
    def runs_from(self, columns: Sequence[str], ordered: str, at: Arrays, limit: int) -> np.ndarray:
        """For each row of ``at`` (``"key"``, and the values of ``columns`` and
        ``ordered`` as :meth:`probe` gives them), how many rows its run holds from it on
        (itself included), counted up to ``limit``; 0 for a key that is not a matching
        row. A row starts a window of ``length`` exactly when this is ``length``."""

    @abstractmethod
    def windows(self, columns: Sequence[str], ordered: str, at: Arrays, length: int) -> np.ndarray:
        """The keys of the window of ``length`` starting at each row of ``at`` (as for
        :meth:`runs_from`): a ``(len(at["key"]), length)`` table, a row of -1 where the
        row starts none."""

    # -- aggregates ----------------------------------------------------------------------
    @abstractmethod
    def largest(self, name: str) -> float | None:
        """The largest value of the buffer's indexed numeric column ``name`` (None when no
        row has one)."""

    @abstractmethod
    def priority_bounds(self) -> PriorityBounds:
        """The buffer's smallest and largest stored priority (None when none is stored)."""

    @abstractmethod
    def lowest_priority(self, walk: int | None) -> tuple[float, int | None] | None:
        """The smallest stored priority among the matching rows and the key of a row that
        holds it, looking through at most ``walk`` of the buffer's lowest priorities
        (None: as far as it takes); ``(inf, None)`` when no matching row holds one; None
        when those ``walk`` hold no matching row and there are more."""

    @abstractmethod
    def logged_priorities(self, after: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The keys and priorities set by the priority updates after number ``after``
        (the signature's ``priority_version``), in update order; None when they are no
        longer known."""

    @abstractmethod
    def group_summaries(self, spec: GroupSpec, keys: np.ndarray) -> Arrays | None:
        """The summaries of the groups (of the matching rows, by ``spec``) whose first row
        is one of the candidate ``keys``, as :meth:`Storage.groups` gives them; None when
        a group's rows cannot be found by an index (each group would be a scan)."""

    @abstractmethod
    def group_counts(self, spec: GroupSpec) -> tuple[int, int, int, int]:
        """How many groups (of the matching rows, by ``spec``) are ready, waiting,
        filtered and stale under this space's ``max_staleness``."""


#: Findings a storage keeps (the ones used last).
KEPT = 128


class Since(NamedTuple):
    """A finding and the buffer it was found in."""

    found: Any
    signature: Signature
    oldest: int | None  # the oldest fresh version then (None: every row)


class Kept:
    """What draws over the key space found about their matching rows (a prioritized draw's
    least priority, a stratified draw's values held), by what was found and the draw
    target (:meth:`KeySpace.condition_key`): the :data:`KEPT` used last.

    Between two draws of a target, rows only leave its matching rows, or new ones arrive
    with higher keys, as long as the buffer moved on by inserts, FIFO eviction, priority
    updates and draws counted (:func:`~expstore.lifecycle.reader_state.moved_on`), and the oldest
    fresh version did not go back: evicted, spent and stale rows leave, nothing else
    changes. What was found then stays true but for those two changes, which the finder
    checks; anything else (deletes, updates, a policy version set back) finds it again.
    """

    def __init__(self) -> None:
        self._kept: OrderedDict[Any, Since] = OrderedDict()

    def get(self, space: KeySpace, what: tuple[Any, ...]) -> Since | None:
        """What was found as ``what`` for ``space``'s target, if the buffer changed since
        only in ways the finder can follow; None when it must be found again."""
        since = self._kept.get((what, space.condition_key()))
        signature = space.signature
        if since is None or signature is None or not moved_on(since.signature, signature):
            return None
        return since if _shrunk(since.oldest, space.oldest) else None

    def put(self, space: KeySpace, what: tuple[Any, ...], found: Any) -> None:
        """Keep ``found`` as ``what`` for ``space``'s target, as of ``space``."""
        if space.signature is None:  # not known: nothing to tell it is still true by
            return
        target = (what, space.condition_key())
        self._kept[target] = Since(found, space.signature, space.oldest)
        self._kept.move_to_end(target)
        while len(self._kept) > KEPT:
            self._kept.popitem(last=False)

    def clear(self) -> None:
        self._kept.clear()


def _shrunk(before: int | None, now: int | None) -> bool:
    """Whether the fresh rows under the oldest fresh version ``now`` are among those under
    ``before`` (None: every row fresh)."""
    if now is None:
        return before is None
    return before is None or now >= before
