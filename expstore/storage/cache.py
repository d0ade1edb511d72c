"""The decoded-row cache: what a fetch of chosen rows decoded, kept in this process so a
row sampled again costs a dictionary look-up instead of a read and a decode.

Rows are written once and never change (priorities, claims, draw counts and versions live
in tables of their own), and a key is never handed out twice in a database's life (see
:mod:`expstore.db.row_ids`; a database restored from a backup of itself hands out keys
again under the same creation time: reopen its handles). So what was decoded for a key
stays what the database holds under it for as long as the row exists, and the cache never
has to ask whether an entry is stale. It never decides which rows a batch holds: a sampler
chooses from the database every time (deleted, evicted, stale, spent and claimed rows are
not chosen), and the cache only saves fetching and decoding the rows chosen. (A row
deleted between the choice and the fetch: a read leaves it out and the caller chooses
again; a hit returns it, as a read would had the delete committed just after it.) A
database made anew under a running process (its buffer row created again, so keys may
repeat) empties it: entries are kept under the storage's
:attr:`~expstore.storage.base.Storage.identity`.

Fields a converter reads are held by slot (:class:`_Fields`): per path, arrays of one
dtype and shape (or a column's numbers) in one slab, other values as read-only copies, so
converters reading different fields of a row share its slot and a batch held is gathered
by one numpy take. A whole row (:class:`~expstore.model.rows.DataRow`, AWorld's path) is
first kept as the database gave it (its text, bytes and numbers: no copy); the first time
it is served again it is decoded and kept decoded, as a frozen copy, so later hits cost a
copy of the row rather than a decode. Either way a caller's batch is its own: mutating it
never changes the cache or another batch. A row is kept on its first read while the cache
holds less than half of what it may, and on its second read beyond that
(:meth:`RowCache._admitted`).

The cache holds at most its budget in bytes (the arrays' bytes and an estimate of the
Python objects around them; rows get seven eighths of it) and forgets fields by CLOCK and
whole rows least recently used first. A row larger than the whole budget is not kept. It
is safe to use from several threads (a prefetching iterator and the trainer).
"""

from __future__ import annotations

import copy
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from itertools import repeat
from typing import Any, NamedTuple, Protocol

import numpy as np

from .._args import check_int
from ..model.paths import MISSING
from ..model.rows import DataRow, Experience, ExpMeta, trusted_many
from .reader import collector_paused

__all__ = ["DEFAULT_CACHE_BYTES", "CacheStats", "RawRows", "RowCache", "copy_value"]


def _default_budget() -> int:
    """An eighth of the machine's memory, at least 256 MiB (where the machine does not say
    how much it has: 256 MiB). A budget is a bound, not an allocation: a buffer smaller than
    it takes only what its rows take."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # (no sysconf: Windows)
        total = 0
    return max(256 * 2**20, total // 8)


#: The budget a storage's cache gets unless told otherwise: an eighth of the machine's
#: memory, at least 256 MiB (3 GiB on a 24 GiB machine: a buffer of 700k rows of a 4 KB
#: observation); ``cache_bytes=0`` turns the cache off.
DEFAULT_CACHE_BYTES = _default_budget()

#: What one key noted as read once takes (a set's slot and an int): the note of keys
#: read once (the doorkeeper, see RowCache._admitted) gets a sixteenth of the budget.
_SEEN_KEY_BYTES = 64
#: ... and notes at least this many keys (a budget under 4 MiB notes more than its share).
_SEEN_KEYS_MIN = 4096

#: What one whole-row entry costs beside its row: the entry and the LRU's node.
_ENTRY_OVERHEAD = 360


class CacheStats(NamedTuple):
    """What a storage's row cache holds and how it has served (``buffer.cache_stats()``)."""

    budget_bytes: int  # 0: the cache is off
    bytes: int  # held now, never above the budget
    rows: int  # rows held now
    hits: int  # rows served from the cache
    misses: int  # rows fetched from the database
    evictions: int  # rows forgotten to stay within the budget
    resets: int  # times it was emptied because the database was made anew

    @property
    def hit_rate(self) -> float:
        """Hits over rows asked for (0.0 before any)."""
        asked = self.hits + self.misses
        return self.hits / asked if asked else 0.0


class _Entry:
    """One whole row: its id, the row as read (:class:`_Raw`) or decoded, and what it
    costs."""

    __slots__ = ("id", "nbytes", "value")

    def __init__(self, row_id: str, value: _Raw | DataRow, nbytes: int) -> None:
        self.id = row_id
        self.value = value
        self.nbytes = _ENTRY_OVERHEAD + sys.getsizeof(row_id) + nbytes


class _Raw(NamedTuple):
    """A whole row as read, with the stored arrays it refers to by digest (one value, so
    a promotion in another thread replaces both at once)."""

    row: tuple[Any, ...]
    arrays: dict[str, bytes] | None


#: Reads fields of rows: (distinct keys, paths, writable) to (ids, each path's values), as
#: :meth:`~expstore.storage.base.Storage.fetch_columns` does.
ReadColumns = Callable[[list[int], Sequence[str], bool], tuple[list[str], list[Any]]]


class RawRows(Protocol):
    """Whole rows as the database gives them, and their decoding: a whole row is kept as
    read (immutable text, bytes and numbers: no copy) until it is first served again."""

    def read_raw(self, keys: list[int]) -> tuple[list[tuple[Any, ...]], dict[str, bytes]]:
        """The rows among the distinct ``keys`` (each a tuple, its key first, its id
        second), in no particular order, and the stored arrays they refer to by digest."""

    def decode_raw(self, raw: Sequence[tuple[Any, ...]], arrays: dict[str, bytes]) -> list[DataRow]:
        """The rows ``raw`` holds, decoded (new objects every call)."""

    def digests_of(self, raw: tuple[Any, ...]) -> list[str]:
        """The digests of the stored arrays one raw row refers to."""


#: A slab's spec: its rows' dtype and shape, and whether they are handed back as Python
#: values (numbers, or lists of numbers of one length and type) rather than arrays.
_Spec = tuple[np.dtype[Any], tuple[int, ...], bool]
#: The slab's dtype for Python numbers of each type (ints within int64).
_PYTHON_DTYPES = {float: np.dtype(np.float64), int: np.dtype(np.int64), bool: np.dtype(np.bool_)}
_INT64 = (-(2**63), 2**63)


def _python_spec(value: Any) -> _Spec | None:
    """The slab spec of a Python number, or of a list of numbers of one type (whose
    ``tolist()`` from the slab gives it back as it was), or None."""
    kind = type(value)
    if kind is list:
        if not value:
            return None
        kind = type(value[0])
        dtype = _PYTHON_DTYPES.get(kind)
        if dtype is None or any(type(v) is not kind for v in value):
            return None
        if kind is int and not (_INT64[0] <= min(value) and max(value) < _INT64[1]):
            return None
        return (dtype, (len(value),), True)
    dtype = _PYTHON_DTYPES.get(kind)
    if dtype is None or (kind is int and not _INT64[0] <= value < _INT64[1]):
        return None
    return (dtype, (), True)


def _numbers(values: Any, of: np.ndarray, column: _Column) -> np.ndarray | None:
    """The numbers ``values[of]`` as one array of the slab of ``column``, when they are
    all Python numbers of its type (a column's, a scalar action's); else None."""
    spec = column.spec
    if type(values) is not list or spec is None or not spec[2] or spec[1]:
        return None
    chosen = [values[i] for i in of.tolist()]
    kind = type(chosen[0])
    dtype = _PYTHON_DTYPES.get(kind)
    # (never ``None != dtype``: numpy reads None as float64)
    if dtype is None or dtype != spec[0] or any(type(v) is not kind for v in chosen):
        return None
    try:
        return np.array(chosen, spec[0])
    except OverflowError:  # (an int beyond int64: held as an object)
        return None


#: What a row held by slot costs beside its values: its key in the map, its slot's
#: places in the lists and arrays.
_SLOT_OVERHEAD = 200


class _Column:
    """One path's values by slot: in a slab (one array whose first axis is the slots)
    when they are arrays of the path's first dtype and shape, else as objects."""

    __slots__ = ("held", "in_slab", "objects", "slab", "spec")

    def __init__(self, capacity: int) -> None:
        self.held = np.zeros(capacity, bool)
        self.in_slab = np.zeros(capacity, bool)
        self.objects: list[Any] = [None] * capacity
        self.slab: np.ndarray | None = None
        self.spec: _Spec | None = None

    def grow(self, capacity: int) -> None:
        extra = capacity - len(self.held)
        self.held = np.concatenate([self.held, np.zeros(extra, bool)])
        self.in_slab = np.concatenate([self.in_slab, np.zeros(extra, bool)])
        self.objects.extend([None] * extra)
        if self.slab is not None:
            slab = np.empty((capacity, *self.slab.shape[1:]), self.slab.dtype)
            slab[: len(self.slab)] = self.slab
            self.slab = slab

    def fits(self, value: Any) -> bool:
        """Whether ``value`` goes in the slab, made for the first value that comes: an
        array (its dtype and shape), or a float, an int or a bool (a column's), or a list
        of them of one type (an action), handed back as Python values."""
        spec: _Spec | None
        if type(value) is np.ndarray:
            if value.dtype.hasobject or not value.ndim:  # (a 0-d array: kept as it is)
                return False
            spec = (value.dtype, value.shape, False)
        else:
            spec = _python_spec(value)
            if spec is None:
                return False
        if self.spec is None:
            self.spec = spec
            self.slab = np.empty((len(self.held), *spec[1]), spec[0])
        return self.spec == spec

    @property
    def scalars(self) -> bool:
        """Whether the slab holds Python values (numbers or lists of them, handed back as
        such by ``tolist()``)."""
        return self.spec is not None and self.spec[2]


class _Fields:
    """Fields of rows by slot: a map from key to slot, and per path a :class:`_Column`.
    A batch of rows held is found with one pass of the map and gathered from a slab with
    one numpy take (no Python object per row to touch). Forgotten by CLOCK: a slot used
    since the hand last passed is spared once. The caller holds the cache's lock."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.slot_of: dict[int, int] = {}
        self.key_at: list[int] = []  # per slot ever made: its key, -1 when free
        self.id_at: list[str] = []  # its row's id, "" when free
        self.ref = np.zeros(0, bool)
        self.size = np.zeros(0, np.int64)
        self.columns: dict[str, _Column] = {}
        self.free: list[int] = []
        self.hand = 0
        self.bytes = 0
        self.used = 0

    def find(self, keys: list[int], paths: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(slots, ok)`` for ``keys``: each one's slot (-1: none) and whether it holds
        every path; the slots held are marked used."""
        slots = np.fromiter(map(self.slot_of.get, keys, repeat(-1)), np.intp, len(keys))
        ok = slots >= 0
        if ok.any():
            safe = np.where(ok, slots, 0)
            for path in paths:
                column = self.columns.get(path)
                if column is None:
                    ok[:] = False
                    break
                ok &= column.held[safe]
            self.ref[slots[ok]] = True
        return slots, ok

    def gather(
        self, path: str, slots: np.ndarray, writable: bool, stack: bool, *, whole: bool = False
    ) -> Any:
        """The values at ``path`` of ``slots``: one array taken from the slab when all are
        there (and ``stack``), else a list of copies (read-only arrays as views when not
        ``writable``). ``whole``: a slab's numbers come as an array too (for
        :func:`_merge`)."""
        column = self.columns[path]
        slab = column.slab
        if slab is not None and column.in_slab[slots].all():
            if column.scalars:
                # Python values, as they were read
                return slab[slots] if whole else slab[slots].tolist()
            if stack:
                return slab[slots]  # (a new array: a take copies)
        out: list[Any] = []
        for slot in slots.tolist():
            if column.in_slab[slot]:
                assert slab is not None
                if column.scalars:
                    out.append(slab[slot].tolist())
                    continue
                value = slab[slot].copy()  # (a view would let the caller write the slab)
                if not writable:  # as a read gives it: read-only, and not to be made writable
                    value.flags.writeable = False
                    value = value.view()
                out.append(value)
                continue
            value = column.objects[slot]
            if type(value) is np.ndarray and not writable:
                out.append(value.view())
            else:
                out.append(copy_value(value))
        return out

    def put(
        self,
        keys: list[int],
        ids: list[str],
        columns: list[Any],
        paths: Sequence[str],
        at: list[int],
    ) -> None:
        """Hold the values of ``keys`` at ``paths``: ``columns[j][at[i]]`` is key i's value
        at path j (a path a row holds already is left as it is: rows never change)."""
        slots = np.array([self._slot(k, i) for k, i in zip(keys, ids, strict=True)], np.intp)
        places = np.array(at, np.intp)
        for path, values in zip(paths, columns, strict=True):
            column = self.columns.get(path)
            if column is None:
                column = self.columns[path] = _Column(len(self.ref))
            new = ~column.held[slots]
            into, of = slots[new], places[new]
            if not len(into):
                continue
            if type(values) is np.ndarray and column.fits(values[of[0]]):
                assert column.slab is not None
                column.slab[into] = values[of]  # one copy for the whole batch
                column.in_slab[into] = True
                column.held[into] = True
                row_bytes = values[of[0]].nbytes
                self.size[into] += row_bytes
                self.bytes += row_bytes * len(into)
                continue
            numbers = _numbers(values, of, column)
            if numbers is not None:  # Python numbers of the slab's type: one copy
                assert column.slab is not None
                column.slab[into] = numbers
                column.in_slab[into] = True
                column.held[into] = True
                row_bytes = numbers.itemsize
                self.size[into] += row_bytes
                self.bytes += row_bytes * len(into)
                continue
            for slot, i in zip(into.tolist(), of.tolist(), strict=True):
                value = values[i]
                if column.fits(value):
                    assert column.slab is not None
                    column.slab[slot] = value
                    column.in_slab[slot] = True
                    size = int(column.slab[slot].nbytes) or 8
                else:
                    sized = [0]
                    column.objects[slot] = _freeze(value, sized)
                    size = sized[0]
                column.held[slot] = True
                self.size[slot] += size
                self.bytes += size

    def _slot(self, key: int, row_id: str) -> int:
        slot = self.slot_of.get(key)
        if slot is not None:
            return slot
        if self.free:
            slot = self.free.pop()
        else:
            slot = len(self.key_at)
            self.key_at.append(-1)
            self.id_at.append("")
            if slot >= len(self.ref):
                self._grow(max(64, len(self.ref) * 3 // 2))
        self.slot_of[key] = slot
        self.key_at[slot] = key
        self.id_at[slot] = row_id
        self.ref[slot] = True
        size = _SLOT_OVERHEAD + sys.getsizeof(row_id)
        self.size[slot] = size
        self.bytes += size
        self.used += 1
        return slot

    def _grow(self, capacity: int) -> None:
        extra = capacity - len(self.ref)
        self.ref = np.concatenate([self.ref, np.zeros(extra, bool)])
        self.size = np.concatenate([self.size, np.zeros(extra, np.int64)])
        for column in self.columns.values():
            column.grow(capacity)

    def evict_to(self, limit: int) -> int:
        """Forget slots by CLOCK until the bytes held are at most ``limit``; how many."""
        count = len(self.key_at)
        evicted = 0
        while self.bytes > limit and self.used:
            slot = self.hand
            self.hand = (slot + 1) % count
            if self.key_at[slot] < 0:
                continue
            if self.ref[slot]:
                self.ref[slot] = False
                continue
            self._forget(slot)
            evicted += 1
        return evicted

    def _forget(self, slot: int) -> None:
        del self.slot_of[self.key_at[slot]]
        self.key_at[slot] = -1
        self.id_at[slot] = ""
        for column in self.columns.values():
            column.held[slot] = False
            column.in_slab[slot] = False
            column.objects[slot] = None
        self.bytes -= int(self.size[slot])
        self.size[slot] = 0
        self.ref[slot] = False
        self.free.append(slot)
        self.used -= 1


class RowCache:
    """A byte-bounded LRU of decoded rows for one storage (see the module's text)."""

    def __init__(self, budget_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.budget = check_int("cache_bytes", budget_bytes, minimum=0)
        #: Whole rows, least recently used first.
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        #: Fields by slot (see :class:`_Fields`).
        self._fields = _Fields()
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._identity: Hashable = None
        self._bytes = 0
        self._hits = self._misses = self._evictions = self._resets = 0
        #: Per path, whether its last read came stacked (see :meth:`fetch_columns`).
        self._stacked: dict[str, bool] = {}
        #: Keys of fields read once (see :meth:`_admitted`).
        self._seen: set[int] = set()

    def __getstate__(self) -> dict[str, Any]:
        # A storage sent to another process takes its budget, not its rows.
        return {"budget": self.budget}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["budget"])  # type: ignore[misc]

    def _guard(self) -> threading.Lock:
        """The lock, made anew (and the rows forgotten) in a process forked from the one
        that made it: a thread of the parent (a prefetching stream) may have held it at
        the fork, and would never release it here."""
        if self._pid != os.getpid():
            self._lock = threading.Lock()
            self._pid = os.getpid()
            self._forget_all()
        return self._lock

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def stats(self) -> CacheStats:
        with self._guard():
            return CacheStats(
                self.budget,
                self._bytes + self._fields.bytes,
                len(self._entries) + self._fields.used,
                self._hits,
                self._misses,
                self._evictions,
                self._resets,
            )

    def clear(self) -> None:
        """Forget every row (the counters stay)."""
        with self._guard():
            self._forget_all()

    def reset(self) -> None:
        """Forget every row because the database was made anew (counted in ``resets``)."""
        with self._guard():
            if self._entries or self._fields.used:
                self._resets += 1
            self._forget_all()

    def _forget_all(self) -> None:
        self._entries.clear()
        self._fields.clear()
        self._seen.clear()
        self._bytes = 0

    def resize(self, budget_bytes: int) -> None:
        """Set the budget (0 turns the cache off and empties it)."""
        budget = check_int("cache_bytes", budget_bytes, minimum=0)
        with self._guard():
            self.budget = budget
            self._shrink()

    def _limit(self) -> int:
        """What the rows may take: the budget less an eighth (a sixteenth for the note of
        keys read once, a sixteenth for what a process's allocator keeps around them)."""
        return self.budget - self.budget // 8

    def _shrink(self) -> None:
        """Forget rows until what is held fits :meth:`_limit`: from whole rows (least
        recently used first) or fields (CLOCK), whichever holds more."""
        entries, fields = self._entries, self._fields
        limit = self._limit()
        while self._bytes + fields.bytes > limit and (entries or fields.used):
            if fields.bytes >= self._bytes:
                self._evictions += fields.evict_to(max(0, limit - self._bytes))
                continue
            _, old = entries.popitem(last=False)
            self._bytes -= old.nbytes
            self._evictions += 1

    # -- the fetch -----------------------------------------------------------------------
    def _begin(self, identity: Hashable, distinct: list[int]) -> dict[int, _Entry]:
        """The whole rows held of ``distinct`` keys, counted as hits (the rest as misses);
        another buffer ``identity`` than the last one's empties the cache first."""
        with self._guard():
            self._check_identity(identity)
            held = self._held(distinct)
            self._hits += len(held)
            self._misses += len(distinct) - len(held)
            return held

    def fetch_rows(
        self, identity: Hashable, keys: Sequence[int] | np.ndarray, source: RawRows
    ) -> tuple[list[DataRow], list[tuple[int, str]]]:
        """``(rows, hits)``: the whole rows with ``keys`` (in order, repeats kept, rows not
        found left out); ``hits`` are the ``(key, id)`` pairs the cache served.

        A row read again (see :meth:`_admitted`) is kept as read (no copy); the first time
        it is served from the cache it is decoded with the rows read and kept decoded from
        then on (a frozen copy), so later hits cost a copy, not a decode."""
        wanted = _key_list(keys)
        distinct = list(dict.fromkeys(wanted))
        held = self._begin(identity, distinct)
        hits = [(k, e.id) for k, e in held.items()]
        ready: dict[int, DataRow] = {}  # held decoded
        raw: dict[int, tuple[Any, ...]] = {}  # to decode: held as read, and read now
        arrays: dict[str, bytes] = {}
        for key, entry in held.items():
            value = entry.value  # (one read: a promotion replaces it whole)
            if isinstance(value, _Raw):
                raw[key] = value.row
                if value.arrays:
                    arrays.update(value.arrays)
            else:
                ready[key] = value
        promote = list(raw)
        missing = [k for k in distinct if k not in held]
        if missing:
            read, found = source.read_raw(missing)
            arrays.update(found)
            raw.update((r[0], r) for r in read)
            admitted = self._admitted(missing)  # (kept on their second read)
            if admitted:
                fresh: dict[int, _Entry] = {}
                for key in admitted:
                    r = raw.get(key)
                    if r is None:  # (deleted since it was chosen)
                        continue
                    r = raw[key] = tuple(r)
                    mine = (
                        {d: found[d] for d in source.digests_of(r) if d in found} if found else None
                    )
                    kept = _Raw(r, mine)
                    fresh[key] = _Entry(r[1], kept, _footprint_raw(kept))
                with self._guard():
                    if identity == self._identity:
                        self._insert(fresh)
        made: dict[int, DataRow] = {}
        if raw:
            order = list(raw)
            made = dict(zip(order, source.decode_raw([raw[k] for k in order], arrays), strict=True))
        with collector_paused():
            if ready:
                order = list(ready)
                made.update(zip(order, copy_rows([ready[k] for k in order]), strict=True))
            if promote:
                sizes: list[int] = []
                frozen = copy_rows([made[k] for k in promote], sizes=sizes)
                self._promote(identity, promote, frozen, sizes)
        return [made[k] for k in wanted if k in made], hits

    def _promote(
        self, identity: Hashable, keys: list[int], rows: list[DataRow], sizes: list[int]
    ) -> None:
        """Keep these rows decoded (held as read until now); ``sizes``: what each takes."""
        with self._guard():
            if identity != self._identity:
                return
            for key, row, size in zip(keys, rows, sizes, strict=True):
                entry = self._entries.get(key)
                if entry is None or not isinstance(entry.value, _Raw):
                    continue
                before = entry.nbytes
                entry.nbytes += size - _footprint_raw(entry.value)
                entry.value = row
                self._bytes += entry.nbytes - before
            self._shrink()

    def fetch_columns(
        self,
        identity: Hashable,
        keys: Sequence[int] | np.ndarray,
        paths: Sequence[str],
        writable: bool,
        read: ReadColumns,
    ) -> tuple[list[str], list[Any], list[tuple[int, str]]]:
        """``(ids, columns, hits)``: the values at ``paths`` of the rows with ``keys`` (in
        order, repeats kept, rows not found left out) as ``read`` gives them, those held
        from the cache, only the others read (and kept); ``hits`` are the ``(key, id)``
        pairs the cache served."""
        wanted = _key_list(keys)
        distinct = list(dict.fromkeys(wanted))
        fields = self._fields
        with self._guard():
            self._check_identity(identity)
            slots, ok = fields.find(distinct, paths)
            n_held = int(ok.sum())
            self._hits += n_held
            self._misses += len(distinct) - n_held
            if distinct and n_held == len(distinct):  # all held: gathered in the lock
                if len(distinct) == len(wanted):
                    where = slots
                else:
                    at = dict(zip(distinct, slots.tolist(), strict=True))
                    where = np.fromiter(map(at.__getitem__, wanted), np.intp, len(wanted))
                id_of = fields.id_at.__getitem__
                ids = list(map(id_of, where.tolist()))
                stacked = self._stacked
                out = [fields.gather(p, where, writable, stacked.get(p, True)) for p in paths]
                hits = list(zip(distinct, map(id_of, slots.tolist()), strict=True))
                return ids, out, hits
        if not n_held:
            # Nothing held (a cold cache, a large buffer): what is read is the answer, and
            # the cache keeps copies of its own of the rows it admits.
            ids, columns = read(wanted, paths, writable)
            self._learn_forms(paths, columns)
            if len(ids) == len(wanted):  # (else rows went: the caller chooses again)
                places = range(len(wanted)) if len(distinct) == len(wanted) else None
                self._keep(identity, distinct, ids, columns, paths, wanted, places)
            return ids, columns, []
        # Some held, some not: the others are read, and the batch put together by row.
        held_keys = [k for k, good in zip(distinct, ok.tolist(), strict=True) if good]
        missing = [k for k, good in zip(distinct, ok.tolist(), strict=True) if not good]
        ids, columns = read(missing, paths, writable)
        self._learn_forms(paths, columns)
        if len(ids) != len(missing):
            # A row chosen was deleted before this read: the batch is read whole, as
            # without a cache (the caller chooses again; nothing of it is kept).
            return (*read(wanted, paths, writable), [])
        self._keep(identity, missing, ids, columns, paths, missing, range(len(missing)))
        with self._guard():
            if identity != self._identity:  # (made anew meanwhile: read it all)
                return (*read(wanted, paths, writable), [])
            slots, ok = fields.find(held_keys, paths)
            if not ok.all():  # (evicted meanwhile by another thread: read it all)
                return (*read(wanted, paths, writable), [])
            stacked = self._stacked
            from_cache = [
                fields.gather(p, slots, writable, stacked.get(p, True), whole=True) for p in paths
            ]
            numbers = [fields.columns[p].scalars for p in paths]
            held_ids = [fields.id_at[s] for s in slots.tolist()]
        # Each wanted row's place in the held rows followed by the rows read: its side
        # (read or held) and its place in that side.
        held = len(held_keys)
        place = {k: i for i, k in enumerate(held_keys)}
        place.update((k, held + i) for i, k in enumerate(missing))
        both = np.fromiter(map(place.__getitem__, wanted), np.intp, len(wanted))
        fresh_side = both >= held
        where_in = both - held * fresh_side
        sides = zip(fresh_side.tolist(), where_in.tolist(), strict=True)
        out_ids = [ids[i] if f else held_ids[i] for f, i in sides]
        out = [
            _merge(cached, fresh, fresh_side, where_in, writable, stacked.get(p, True), number)
            for p, cached, fresh, number in zip(paths, from_cache, columns, numbers, strict=True)
        ]
        hits = list(zip(held_keys, held_ids, strict=True))
        return out_ids, out, hits

    def offer(
        self, identity: Hashable, rows: tuple[list[int], list[str]], fields: dict[str, Any]
    ) -> None:
        """Keep fields of rows this process has just written and seen committed (``rows``:
        their distinct keys and their ids; ``fields``: per path, the rows' values in that
        order, as :meth:`fetch_columns`' ``read`` would give them), admitted as a read of
        them would be (:meth:`_admitted`). Their keys are theirs for good, so nothing goes
        stale: the caller still asks the database which keys it wants."""
        keys, ids = rows
        if not self.enabled or not keys:
            return
        with self._guard():
            self._check_identity(identity)
        paths = list(fields)
        self._keep(identity, keys, ids, [fields[p] for p in paths], paths, keys, range(len(keys)))

    def paths_read(self) -> list[str]:
        """The paths :meth:`fetch_columns` has read since the cache was made (the fields
        this process's converters ask for); none while the cache would not keep rows read
        for the first time (more than half full: see :meth:`_admitted`)."""
        with self._guard():
            if self._bytes + self._fields.bytes >= self._limit() // 2:
                return []
            return list(self._stacked)

    def _learn_forms(self, paths: Sequence[str], columns: list[Any]) -> None:
        """Note whether the database's values at each path came stacked (a tensor field
        the decoder stacks) or as a list (parts walked in Python, say): the cache hands
        them out in the same form."""
        for path, values in zip(paths, columns, strict=True):
            self._stacked[path] = type(values) is np.ndarray

    def _check_identity(self, identity: Hashable) -> None:
        """Another ``identity`` than the last one's empties the cache first (in the lock)."""
        if identity != self._identity:
            if self._entries or self._fields.used:
                self._resets += 1
            self._forget_all()
            self._identity = identity

    def _held(self, distinct: list[int]) -> dict[int, _Entry]:
        """The whole rows held of ``distinct`` keys, moved to the recent end."""
        entries = self._entries
        held: dict[int, _Entry] = {}
        for key in distinct:
            entry = entries.get(key)
            if entry is not None:
                held[key] = entry
                entries.move_to_end(key)
        return held

    def _keep(
        self,
        identity: Hashable,
        keys: list[int],
        ids: list[str],
        columns: list[Any],
        paths: Sequence[str],
        read_keys: list[int],
        places: Sequence[int] | None,
    ) -> None:
        """Keep the fields just read of the distinct ``keys`` that were read before (see
        :meth:`_admitted`): ``ids`` and ``columns`` run over ``read_keys`` (``places``:
        where each of ``keys`` is in them; None: found by key), copied into the cache."""
        admitted = self._admitted(keys)
        if not admitted:
            return
        if places is None or len(admitted) < len(keys):
            first = _first_places(read_keys)
            chosen = [k for k in keys if k in admitted]
            at = [first[k] for k in chosen]
        else:
            chosen, at = keys, list(places)
        with collector_paused(), self._guard():
            if identity != self._identity:
                return
            self._fields.put(chosen, [ids[i] for i in at], columns, paths, at)
            self._shrink()

    def _admitted(self, keys: list[int]) -> set[int]:
        """The distinct ``keys`` to keep now: all of them while the cache holds less than
        half of what it may (nothing would be forgotten for them); beyond that, those read
        once before, all being noted.

        Past half, a row is kept on its second read, not its first (a doorkeeper, as
        TinyLFU's): rows drawn once in a long while (a buffer much larger than the budget,
        uniform draws) would only churn the cache. Below it, a row written and then drawn
        (a trainer's new rows) is served from the cache from its second draw on. The note
        is a set of keys, emptied when full: a sixteenth of the budget, at
        :data:`_SEEN_KEY_BYTES` a key (the rows get the rest)."""
        with self._guard():
            if self._bytes + self._fields.bytes < self._limit() // 2:
                # Room to spare: nothing would be forgotten for them, so nothing churns.
                return set(keys)
            seen = self._seen
            admitted = seen.intersection(keys)
            if len(seen) + len(keys) > max(_SEEN_KEYS_MIN, self.budget // 16 // _SEEN_KEY_BYTES):
                seen.clear()
            seen.update(keys)
            return admitted

    def _insert(self, fresh: dict[int, _Entry]) -> None:
        entries = self._entries
        for key, entry in fresh.items():
            old = entries.pop(key, None)
            if old is not None:  # (kept meanwhile by another thread: this one replaces it)
                self._bytes -= old.nbytes
            if entry.nbytes > self._limit():
                continue
            entries[key] = entry
            self._bytes += entry.nbytes
        self._shrink()


def _key_list(keys: Sequence[int] | np.ndarray) -> list[int]:
    return keys.tolist() if isinstance(keys, np.ndarray) else [int(k) for k in keys]


def _first_places(wanted: list[int]) -> dict[int, int]:
    """Each key's first position in ``wanted``."""
    places: dict[int, int] = {}
    for i, key in enumerate(wanted):
        places.setdefault(key, i)
    return places


# -- copies and sizes ----------------------------------------------------------------------
def copy_value(value: Any) -> Any:
    """A copy of a decoded value that shares nothing mutable with it: dicts and lists
    copied through, arrays copied; strings, numbers, None and MISSING as they are."""
    kind = type(value)
    if kind is dict:
        return {k: copy_value(v) for k, v in value.items()}
    if kind is list:
        return [copy_value(v) for v in value]
    if kind is np.ndarray:
        return value.copy()
    if kind in _IMMUTABLE or value is MISSING:
        return value
    return copy.deepcopy(value)  # anything else a codec extension decodes to


_IMMUTABLE = frozenset({str, int, float, bool, type(None), bytes, tuple})
_NUMBERS = frozenset({int, float, bool})
_SCALAR_BYTES = 32  # an int, a float, a bool: about what each takes


def _freeze(value: Any, size: list[int]) -> Any:
    """What the cache keeps of a value: :func:`copy_value`'s copy with its arrays
    read-only, adding about what it takes in memory to ``size[0]`` (one walk for both)."""
    kind = type(value)
    if kind is dict:
        size[0] += sys.getsizeof(value)
        return {k: _freeze(v, size) for k, v in value.items()}
    if kind is list:
        size[0] += sys.getsizeof(value)
        return [_freeze(v, size) for v in value]
    if kind is np.ndarray:
        out = value.copy()
        out.flags.writeable = False
        size[0] += out.nbytes + 128
        return out
    if kind is str:
        size[0] += sys.getsizeof(value)
        return value
    if kind in _IMMUTABLE or value is MISSING:
        size[0] += _SCALAR_BYTES
        return value
    size[0] += sys.getsizeof(value)
    return copy.deepcopy(value)


def copy_rows(rows: Sequence[DataRow], *, sizes: list[int] | None = None) -> list[DataRow]:
    """Copies of decoded rows sharing nothing mutable with them, made as the reader makes
    rows (:func:`~expstore.model.rows.trusted_many`: their values were validated when
    stored). With ``sizes``, the copies the cache keeps (:func:`_freeze`: arrays
    read-only), and about what each takes in memory appended to ``sizes``."""
    metas = trusted_many(ExpMeta, (dict(r.exp_meta.__dict__) for r in rows))
    if sizes is not None:
        contents = []
        for r in rows:
            size = [_ROW_OVERHEAD + sys.getsizeof(r.id)]
            contents.append({name: _freeze(v, size) for name, v in r.exp_data.__dict__.items()})
            sizes.append(size[0])
    else:
        contents = [{name: copy_value(v) for name, v in r.exp_data.__dict__.items()} for r in rows]
    data = trusted_many(Experience, contents)
    return trusted_many(
        DataRow,
        (
            {"exp_meta": m, "exp_data": d, "id": r.id}
            for m, d, r in zip(metas, data, rows, strict=True)
        ),
    )


#: Three pydantic model objects with their dicts and fields-sets, and the metadata's
#: dozen scalars: what a row takes beside its payload.
_ROW_OVERHEAD = 3 * 400 + 12 * 60


def _assemble(values: list[Any], writable: bool, stack: bool = True) -> Any:
    """One path's values over the batch from the cache: with ``stack``, an array whose
    first axis is the rows when every value is an array of one dtype and shape (as a fetch
    stacks a tensor field), else a list of copies (read-only arrays shared, as views, when
    ``writable`` is off)."""
    if stack and values and all(type(v) is np.ndarray for v in values):
        first = values[0]
        if all(v.dtype == first.dtype and v.shape == first.shape for v in values):
            return np.stack(values)
    if writable:
        return [copy_value(v) for v in values]
    # A view of a read-only array cannot be made writable (the array itself could).
    return [v.view() if type(v) is np.ndarray else copy_value(v) for v in values]


def _merge(
    cached: Any,
    fresh: Any,
    fresh_side: np.ndarray,
    at: np.ndarray,
    writable: bool,
    stack: bool,
    numbers: bool,
) -> Any:
    """One path's values over a batch partly held (``cached``, from :meth:`_Fields.gather`
    with ``whole``) and partly read (``fresh``): row i is ``fresh[at[i]]`` where
    ``fresh_side[i]``, else ``cached[at[i]]``. Two arrays of rows of one dtype and shape
    (a stacked field held in a slab) merge in two numpy takes; a slab of numbers
    (``numbers``: a column's) gives Python numbers, as a column is read; anything else is
    put together row by row."""
    if numbers and type(cached) is np.ndarray:
        cached = cached.tolist()
        if type(fresh) is list and all(type(v) in _NUMBERS for v in fresh):
            # (immutable: nothing to copy)
            return [
                fresh[i] if f else cached[i]
                for f, i in zip(fresh_side.tolist(), at.tolist(), strict=True)
            ]
    if (
        stack
        and type(cached) is np.ndarray
        and type(fresh) is np.ndarray
        and cached.dtype == fresh.dtype
        and cached.shape[1:] == fresh.shape[1:]
    ):
        out = np.empty((len(at), *cached.shape[1:]), cached.dtype)
        out[fresh_side] = fresh[at[fresh_side]]
        out[~fresh_side] = cached[at[~fresh_side]]
        return out
    if type(cached) is np.ndarray:  # rows of a slab, each as :meth:`_Fields.gather` gives it
        cached.flags.writeable = writable  # (its rows: views the caller cannot make writable)
        cached = list(cached)
    values = [
        fresh[i] if f else cached[i] for f, i in zip(fresh_side.tolist(), at.tolist(), strict=True)
    ]
    return _assemble(values, writable, stack)


def _footprint_raw(raw: _Raw) -> int:
    """What a row as read takes: its tuple, the text, bytes and numbers in it, and the
    stored arrays it refers to."""
    row = raw.row
    return (
        sys.getsizeof(row)
        + sum(map(sys.getsizeof, row))
        + sum(map(len, (raw.arrays or {}).values()))
    )
