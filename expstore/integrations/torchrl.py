"""A TorchRL replay-buffer storage whose slots are rows of an expstore buffer.

>>> from torchrl.data import TensorDictReplayBuffer
>>> from expstore.integrations.torchrl import ExpstoreStorage
>>> rb = TensorDictReplayBuffer(
...     storage=ExpstoreStorage(100_000, url="sqlite:///runs/dqn.db", name="dqn"),
...     batch_size=256)
>>> rb.extend(rollout)            # committed: survives the process, seen by every process
>>> batch = rb.sample()

TorchRL's contract (``torchrl/data/replay_buffers/storages/base.py``): the writer picks the
slots (``RoundRobinWriter``: ``cursor, cursor + 1, ...`` modulo ``max_size``) and calls
``set(slots, data)``; the sampler draws slot indices in ``[0, len(storage))`` and the
buffer calls ``get(indices)``. Here a slot is a row of the buffer ``name`` with
``task_id="slots"`` and ``step=slot`` (the ``(buffer, task_id, step)`` index finds it):

- ``set`` stores the new rows and deletes the rows the same slots held, in one
  transaction, so a slot holds one row at every commit (a reader never sees a slot empty
  or doubled), and writers of the buffer take turns on its row, so two processes that
  write the same slot leave the later write there. The round-robin overwrite at
  ``max_size`` is TorchRL's: the writer's cursor moves, the storage only writes slots.
- ``len(storage)`` is the number of filled slots (the buffer's row count, kept on its
  row): a round-robin writer fills them ``0, 1, ...`` so it is also the next fresh slot.
- ``get`` reads the buffer's counters (one row); while they show no change but this
  process's own writes, a map of which row each slot holds answers (rows another process
  only added are read into it; any other change drops it, and the slot index answers
  until two reads in a row find the buffer unchanged). The leaves come from the buffer's
  row cache, which keeps the rows this process wrote and read by key (a key is one row
  for good, so nothing it holds goes stale), the rest cut out of their blobs.
- A row's id is its slot (ten digits) then 88 random bits, so it sorts beside the id of
  the row it replaces (fewer index pages written).

Elements go in and come out as TorchRL gives them: a tensor, a TensorDict (nested keys,
batch dimensions after the first) or a pytree of tensors, every leaf with its dtype
(bfloat16 included), shape, device and bits; each row keeps the element's layout
(``exp_data.state.torchrl``) so another process reads them back without being told.

Several processes write one buffer: hand them the TorchRL buffer (pickled to a spawned
or forked process, the storage travels as its url and name and connects again there, and
TorchRL shares the writer's cursor with it), as ``examples/torchrl_dqn.py`` does with two
collector processes. Every committed ``extend`` is then visible to every process at once.
Processes that open the buffer on their own (another machine) keep cursors of their own;
they may write the same slots, the later write winning, or better write rows through
expstore's own API (``buffer.extend``) and sample with expstore's samplers.
"""

from __future__ import annotations

import json
import math
import os
import socket
import uuid
from collections.abc import Sequence
from hashlib import blake2b
from pathlib import Path
from typing import Any

from .._optional import require
from ..errors import InvalidArgumentError, OutOfRangeError, StorageError, UnsupportedTypeError

_purpose = "expstore.integrations.torchrl"
require("torchrl", _purpose)  # first: without it, fail before importing torch
torch: Any = require("torch", _purpose)
_storages: Any = require("torchrl.data.replay_buffers.storages", _purpose)
_checkpointers: Any = require("torchrl.data.replay_buffers.checkpointers", _purpose)
_tensordict: Any = require("tensordict", _purpose)
_pytree: Any = require("torch.utils._pytree", _purpose)

import numpy as np  # noqa: E402
from sqlalchemy import BigInteger, bindparam, select  # noqa: E402

from ..buffer import ReplayBuffer  # noqa: E402
from ..codec.format import HEADER_SIZE, intact  # noqa: E402
from ..db.handle import BufferHandle  # noqa: E402
from ..db.schema import buffers, rows  # noqa: E402
from ..storage import writer  # noqa: E402
from ..storage.column_rows import column_source  # noqa: E402

__all__ = ["ExpstoreCheckpointer", "ExpstoreStorage"]

#: The task_id of a storage's slot rows; a slot is the row's ``step``.
SLOTS = "slots"
#: Where each row keeps its element's layout.
LAYOUT_PATH = "exp_data.state.torchrl"


class _Layout:
    """What an element is, beside its leaves: the JSON each row keeps.

    ``kind``: ``"tensor"``, ``"tensordict"`` or ``"pytree"``; ``keys``: each leaf's key
    (a TensorDict's nested key as a list; a pytree's leaf number); ``batch``: a
    TensorDict element's batch dimensions; ``device``: where the element was (None: a
    TensorDict without one); ``tree``: a pytree's spec (``torch.utils._pytree``'s JSON)."""

    __slots__ = ("batch", "cached_as", "device", "keys", "kind", "plan", "text", "tree")

    def __init__(
        self,
        kind: str,
        keys: list[list[str]],
        batch: list[int],
        device: str | None,
        tree: str | None = None,
    ) -> None:
        self.kind, self.keys, self.batch, self.device, self.tree = kind, keys, batch, device, tree
        #: where the leaves are in a row's blob (see ExpstoreStorage._blob_leaves)
        self.plan: Any = None
        #: the name the row cache keeps these rows' leaves under (see _cache_path)
        self.cached_as: str | None = None
        self.text = json.dumps(
            {"kind": kind, "keys": keys, "batch": batch, "device": device, "tree": tree},
            sort_keys=True,
        )

    @classmethod
    def parse(cls, text: str) -> _Layout:
        d = json.loads(text)
        return cls(d["kind"], d["keys"], d["batch"], d["device"], d["tree"])


def _split(data: Any) -> tuple[_Layout, list[Any]]:
    """An element batch (first dimension: the elements) as its layout and its leaves."""
    if _tensordict.is_tensor_collection(data):
        leaves, keys = [], []
        for key in data.keys(include_nested=True, leaves_only=True):
            value = data.get(key)
            if not isinstance(value, torch.Tensor):
                raise UnsupportedTypeError(
                    f"ExpstoreStorage stores tensors; the TensorDict's entry {key!r} holds "
                    f"{type(value).__name__}; store it as a tensor (or encode it in one)"
                )
            keys.append([key] if isinstance(key, str) else list(key))
            leaves.append(value)
        device = None if data.device is None else str(data.device)
        return _Layout("tensordict", keys, list(data.batch_size[1:]), device), leaves
    if isinstance(data, torch.Tensor):
        return _Layout("tensor", [], [], str(data.device)), [data]
    leaves, spec = _tensor_leaves(data)
    device = str(leaves[0].device)
    keys = [[str(i)] for i in range(len(leaves))]
    return _Layout("pytree", keys, [], device, _pytree.treespec_dumps(spec)), leaves


def _tensor_leaves(data: Any) -> tuple[list[Any], Any]:
    """A pytree's leaves and spec (UnsupportedTypeError unless every leaf is a tensor)."""
    leaves, spec = _pytree.tree_flatten(data)
    bad = [type(leaf).__name__ for leaf in leaves if not isinstance(leaf, torch.Tensor)]
    if bad or not leaves:
        raise UnsupportedTypeError(
            "ExpstoreStorage stores tensors, TensorDicts and pytrees of tensors; got "
            f"{type(data).__name__} with leaves of types {sorted(set(bad)) or 'none'}"
        )
    return leaves, spec


def _join(layout: _Layout, leaves: list[Any], shape: tuple[int, ...]) -> Any:
    """The element batch of ``shape`` (the index's) from its leaves (first dimension: the
    rows, in the index's order)."""
    device = layout.device
    leaves = [leaf.reshape((*shape, *leaf.shape[1:])) for leaf in leaves]
    if device is not None and device != "cpu":
        leaves = [leaf.to(device) for leaf in leaves]
    if layout.kind == "tensor":
        return leaves[0]
    if layout.kind == "pytree":
        return _pytree.tree_unflatten(leaves, _pytree.treespec_loads(layout.tree))
    td = _tensordict.TensorDict({}, batch_size=[*shape, *layout.batch], device=device)
    for key, leaf in zip(layout.keys, leaves, strict=True):
        td.set(tuple(key) if len(key) > 1 else key[0], leaf)
    return td


def _stack(items: list[Any]) -> Any:
    """A list of elements (``rb.extend([...])``) as one batch."""
    first = items[0]
    if _tensordict.is_tensor_collection(first):
        return _tensordict.TensorDict.stack(items) if len(items) > 1 else first.unsqueeze(0)
    if isinstance(first, torch.Tensor):
        return torch.stack(items)
    leaves = [_tensor_leaves(item)[0] for item in items]
    spec = _pytree.tree_flatten(first)[1]
    return _pytree.tree_unflatten([torch.stack(ls) for ls in zip(*leaves, strict=True)], spec)


def _slot_rows(
    handle: BufferHandle, conn: Any, slots: list[int], *columns: Any
) -> list[Sequence[Any]]:
    """``columns`` of the rows the storage's ``slots`` hold, by one statement compiled once
    per handle and columns (the slots are one bound set; not ordered: SQLite would walk
    the key index). Columns of the buffer's row (:data:`_COUNTERS`) come with each row."""
    dialect = handle.dialect
    joined = any(column.table is buffers for column in columns)

    def build() -> Any:
        stmt = select(*columns).where(
            rows.c.buffer_id == handle.buffer_id,
            rows.c.task_id == SLOTS,
            dialect.key_in(rows.c.step),
        )
        return stmt.where(buffers.c.id == rows.c.buffer_id) if joined else stmt

    what = ("torchrl slots", *(f"{column.table.name}.{column.name}" for column in columns))
    return handle.statement(what, build).run(conn, keys=dialect.key_set(sorted(set(slots))))


def _key_rows(handle: BufferHandle, conn: Any, keys: list[int]) -> list[Sequence[Any]]:
    """Key, id and tensor blob of the buffer's rows with ``keys`` (distinct), by one
    statement compiled once per handle."""
    dialect = handle.dialect

    def build() -> Any:
        return select(rows.c.key, rows.c.id, rows.c.tensors).where(
            rows.c.buffer_id == handle.buffer_id, dialect.key_in(rows.c.key)
        )

    return handle.statement(("torchrl rows",), build).run(conn, keys=dialect.key_set(keys))


def _blob_table(blobs: list[tuple[str, Any]], size: int) -> Any:
    """The rows' tensor blobs (each with its row's id) as one uint8 array, a row each, or
    None when one is damaged or not ``size`` bytes long (another layout: the codec says
    what it holds)."""
    kept = []
    for rid, blob in blobs:
        blob = bytes(blob) if isinstance(blob, memoryview) else blob
        if len(blob) != size or not intact(blob, rid):
            return None
        kept.append(blob)
    return np.frombuffer(b"".join(kept), np.uint8).reshape(len(kept), size)


def _cache_path(layout: _Layout, leaves: Sequence[tuple[Any, Sequence[int]]]) -> str:
    """The name the row cache keeps a slot row's leaves under, their raw bytes one after
    the other (:func:`_packed`): named by the element's layout and each leaf's dtype and
    shape, so rows of another layout are never taken for these (no stored path looks like
    it)."""
    text = layout.text + repr([(str(dtype), [int(d) for d in shape]) for dtype, shape in leaves])
    return f"torchrl:{blake2b(text.encode(), digest_size=8).hexdigest()}"


def _packed(leaves: list[Any]) -> Any:
    """Leaf batches (first dimension: the rows, on the CPU) as one uint8 array, a row
    each: each leaf's raw bytes (what a row's blob holds of it), one after the other."""
    n = int(leaves[0].shape[0])
    parts = []
    for leaf in leaves:
        flat = leaf.contiguous().reshape(n, math.prod(leaf.shape[1:]))
        parts.append((flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)).numpy())
    return np.concatenate(parts, axis=1)


#: The buffer's counters that every change moves: its version (removals), rows ever
#: inserted, rows now, and its creation (a database made anew).
_COUNTERS = (buffers.c.version, buffers.c.inserted, buffers.c.row_count, buffers.c.created_at)


def _counters(handle: BufferHandle, conn: Any) -> tuple[Any, ...]:
    """The buffer's :data:`_COUNTERS` now."""

    def build() -> Any:
        return select(*_COUNTERS).where(buffers.c.id == handle.buffer_id)

    return tuple(handle.statement(("torchrl counters",), build).run(conn)[0])


def _slot_rows_after(handle: BufferHandle, conn: Any, key: int) -> list[Sequence[Any]]:
    """Slot and key of the storage's rows with keys above ``key`` (rows written since)."""

    def build() -> Any:
        return select(rows.c.step, rows.c.key).where(
            rows.c.buffer_id == handle.buffer_id,
            rows.c.key > bindparam("after", type_=BigInteger),
            rows.c.task_id == SLOTS,
        )

    return handle.statement(("torchrl slots after",), build).run(conn, after=key)


def _all_slot_rows(handle: BufferHandle, conn: Any) -> list[Sequence[Any]]:
    """Slot and key of every row of the storage (the slot index alone)."""

    def build() -> Any:
        return select(rows.c.step, rows.c.key).where(
            rows.c.buffer_id == handle.buffer_id, rows.c.task_id == SLOTS
        )

    return handle.statement(("torchrl all slots",), build).run(conn)


class _SlotMap:
    """Which row (key) each slot holds (-1: none), as the buffer was at ``counters``
    (:func:`_counters`), in the process ``pid``. Rows never change and a key is never
    handed out twice, so while the counters stay the same the map is what the database
    holds; a read checks them first (one row's read) and brings the map up to date or
    drops it (see ExpstoreStorage._slot_keys)."""

    __slots__ = ("counters", "keys", "max_key", "pid")

    def __init__(self, size: int, counters: tuple[Any, ...]) -> None:
        self.keys = np.full(size, -1, np.int64)
        self.counters = counters
        self.max_key = 0
        self.pid = os.getpid()

    def put(self, found: Sequence[Sequence[Any]], *, into_empty: bool = False) -> bool:
        """Note these (slot, key) rows; False (nothing noted) if one falls outside the
        slots, or with ``into_empty`` names a slot the map has filled."""
        if not found:
            return True
        pairs = np.asarray(found, np.int64).reshape(-1, 2)
        slots, keys = pairs[:, 0], pairs[:, 1]
        if slots.min() < 0 or slots.max() >= len(self.keys):
            return False
        if into_empty and (self.keys[slots] >= 0).any():
            return False
        order = np.argsort(keys, kind="stable")  # (the newest row of a slot last)
        self.keys[slots[order]] = keys[order]
        self.max_key = max(self.max_key, int(keys.max()))
        return True


def _missing_slots(name: str, missing: list[int], held: int, wanted: int) -> OutOfRangeError:
    return OutOfRangeError(
        f"slots {missing[:5]} of the storage {name!r} hold nothing ({held} of the "
        f"{wanted} asked are filled); sample indices below len(storage)"
    )


def _slots(cursor: Any, max_size: int) -> list[int]:
    """The slots a cursor names (an int, a sequence, a tensor, a range or a slice)."""
    if isinstance(cursor, slice):
        return list(range(*cursor.indices(max_size)))
    if isinstance(cursor, torch.Tensor):
        return [int(i) for i in cursor.reshape(-1).tolist()]
    if isinstance(cursor, (int, range)) or hasattr(cursor, "__index__"):
        return [int(cursor)] if not isinstance(cursor, range) else list(cursor)
    return [int(i) for i in cursor]


class ExpstoreCheckpointer(_checkpointers.StorageCheckpointerBase):  # type: ignore[misc]
    """``rb.dumps(path)`` / ``rb.loads(path)`` of an :class:`ExpstoreStorage`: the rows are
    already durable in the database (every ``extend`` committed), so a checkpoint holds
    where they are (``expstore.json``: url, buffer name, max_size, last cursor), and loading
    it opens that buffer again."""

    def dumps(self, slots: ExpstoreStorage, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / "expstore.json").write_text(json.dumps(slots.state_dict()))

    def loads(self, slots: ExpstoreStorage, path: str | Path) -> None:
        slots.load_state_dict(json.loads((Path(path) / "expstore.json").read_text()))


class ExpstoreStorage(_storages.Storage):  # type: ignore[misc]
    """TorchRL's ``Storage`` on the expstore buffer ``name`` at ``url`` (SQLite or
    Postgres): ``max_size`` slots, each a row (see the module's docstring).

    ``ExpstoreStorage(max_size, *, url="sqlite:///expstore.db", name="torchrl",
    compilable=False)``; ``policy_version``: stamped on the rows written from now on (an
    attribute to set as the policy changes), which TorchRL's ``StalenessAwareSampler`` and
    expstore's ``max_staleness`` read. ``buffer`` is the expstore
    :class:`~expstore.ReplayBuffer` itself, for queries, exports and expstore's samplers.
    """

    _default_checkpointer = ExpstoreCheckpointer

    def __init__(
        self,
        max_size: int,
        *,
        url: str = "sqlite:///expstore.db",
        name: str = "torchrl",
        compilable: bool = False,
    ) -> None:
        if not isinstance(max_size, int) or isinstance(max_size, bool) or max_size < 1:
            raise InvalidArgumentError(
                f"max_size must be a positive int (the number of slots); got {max_size!r}"
            )
        super().__init__(max_size=max_size, compilable=compilable)
        self.url, self.name = str(url), name
        self.policy_version: int | None = None
        self._last_cursor: Any = None
        self._layout: _Layout | None = None
        self._shapes: tuple[Any, ...] = ()
        self._opened: tuple[int, ReplayBuffer] | None = None
        self._full = False
        #: which row each slot holds, kept while the buffer's counters say it is current
        self._map: _SlotMap | None = None
        #: the counters the last read without a map found (the same twice: make the map)
        self._quiet: tuple[Any, ...] | None = None
        self.buffer  # noqa: B018  (opened now: a bad url fails here, not at the first write)

    # -- the expstore buffer, one per process ------------------------------------------
    @property
    def buffer(self) -> ReplayBuffer:
        """The expstore buffer the slots are rows of (opened again in a forked process)."""
        opened = self._opened
        if opened is None or opened[0] != os.getpid():
            opened = self._opened = (os.getpid(), ReplayBuffer(self.url, name=self.name))
        return opened[1]

    def __getstate__(self) -> dict[str, Any]:
        state: dict[str, Any] = super().__getstate__()
        state["_opened"] = None  # connections stay in their process; the url travels
        state["_map"] = state["_quiet"] = None  # another process reads the slots again
        return state

    # -- TorchRL's contract ---------------------------------------------------------------
    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        """Write ``data`` (one element for an int cursor, else a batch whose first
        dimension runs over the slots of ``cursor``) into those slots, in one transaction
        that also deletes what the slots held."""
        if set_cursor:
            self._set_last_cursor(cursor)
        slots = _slots(cursor, self.max_size)
        if isinstance(data, list):
            data = _stack(data)
        elif isinstance(cursor, int) or (isinstance(cursor, torch.Tensor) and cursor.ndim == 0):
            data = _stack([data])
        layout, leaves = _split(data)
        n = int(leaves[0].shape[0]) if leaves[0].ndim else 0
        if n != len(slots):
            raise InvalidArgumentError(
                f"set() got {len(slots)} slots and a batch of {n} elements; give one "
                "element per slot (the first dimension of the data)"
            )
        bad = [s for s in slots if not 0 <= s < self.max_size]
        if bad:
            raise OutOfRangeError(
                f"slots must be in [0, {self.max_size}) (max_size); got {bad[:5]}"
            )
        # A batch longer than the buffer names a slot twice: the last element wins, as
        # when a tensor storage writes them in order.
        last = {slot: i for i, slot in enumerate(slots)}
        if len(last) < len(slots):
            keep = torch.tensor(sorted(last.values()))
            slots = [slots[i] for i in keep.tolist()]
            leaves = [leaf[keep] for leaf in leaves]
        self._write(slots, layout, leaves)
        # The same layout with the same leaves (dtype, shape) keeps where the leaves are in
        # a row's blob, found once (each write would otherwise read a row to find it again)
        shapes = tuple((leaf.dtype, tuple(leaf.shape[1:])) for leaf in leaves)
        if self._layout is None or (self._layout.text, self._shapes) != (layout.text, shapes):
            self._layout, self._shapes = layout, shapes
        self._bump_mutation_revision()

    def _write(self, slots: list[int], layout: _Layout, leaves: list[Any]) -> None:
        n = len(slots)
        cpu = [leaf.detach().cpu() for leaf in leaves]
        columns: dict[str, Any] = {
            # The slot, then 88 random bits: a row's id sorts beside the id of the row its
            # slot held before (an extend of 256 slots wrote 41% fewer pages than with
            # random ids, measured on SQLite: the id index's entries change in place)
            "id": [f"{slot:010d}{uuid.uuid4().hex[:22]}" for slot in slots],
            "task_id": SLOTS,
            "agent_id": f"{socket.gethostname()}:{os.getpid()}",
            "step": slots,
            # [n, 1, ...]: each row's leaf a tensor even for a scalar element
            "state": {
                "torchrl": [layout.text] * n,
                **{f"l{i}": leaf.unsqueeze(1) for i, leaf in enumerate(cpu)},
            },
        }
        if self.policy_version is not None:
            columns["policy_version"] = self.policy_version
        handle = self.buffer.sql.handle
        cache = self.buffer.sql.row_cache
        tracked = cache.enabled  # (without the cache, reads ask the slot index every time)
        counters: list[tuple[Any, ...]] = []

        replaced = [0]

        def held(conn: Any) -> list[str]:
            # The rows these slots hold now, replaced in the write's transaction as
            # delete() removes a row (tombstone, counts, the version readers follow), and
            # the buffer's counters as this write finds them (its row taken)
            found = _slot_rows(handle, conn, slots, rows.c.id, *(_COUNTERS if tracked else ()))
            if tracked:
                counters[:] = [tuple(found[0][1:]) if found else _counters(handle, conn)]
            replaced[0] = len(found)
            return [str(row[0]) for row in found]

        written: dict[int, int] = {}

        def wrote(conn: Any) -> None:
            # The keys the new rows got and the counters after, for the slot map and the
            # row cache (read in the write's transaction)
            found = _slot_rows(handle, conn, slots, rows.c.step, rows.c.key, *_COUNTERS)
            written.clear()
            written.update((int(row[0]), int(row[1])) for row in found)
            counters[1:] = [tuple(found[0][2:])]

        writer.replace_rows(handle, column_source(columns), held, wrote if tracked else None)
        if tracked:
            self._moved(counters[0], counters[1], written, replaced[0])
        if tracked and not any(leaf.dtype.is_complex for leaf in cpu):
            # Committed: the row cache keeps the leaves as these rows' blobs hold them, so a
            # sample of them reads only which rows its slots hold (see _cached_leaves).
            specs = [(leaf.dtype, leaf.shape[1:]) for leaf in cpu]
            cache.offer(
                self.buffer.sql.identity,
                ([written[slot] for slot in slots], columns["id"]),
                {_cache_path(layout, specs): _packed(cpu)},
            )

    def get(self, index: Any) -> Any:
        """The elements at the slots ``index`` names: one element for an int, else a batch
        shaped like the index (a slice: the filled slots it covers)."""
        if isinstance(index, tuple) and len(index) == 1:  # one index per storage dimension
            index = index[0]
        single = isinstance(index, int) or (isinstance(index, torch.Tensor) and index.ndim == 0)
        if isinstance(index, slice):
            flat = list(range(*index.indices(len(self))))
            shape: tuple[int, ...] = (len(flat),)
        elif isinstance(index, torch.Tensor):
            if index.dtype == torch.bool:
                index = index.nonzero().squeeze(-1)
            flat, shape = [int(i) for i in index.reshape(-1).tolist()], tuple(index.shape)
        elif isinstance(index, range):
            flat, shape = list(index), (len(index),)
        elif single:
            flat, shape = [int(index)], ()
        else:
            flat = [int(i) for i in index]
            shape = (len(flat),)
        if flat and min(flat) < 0:
            size = len(self)
            flat = [i + size if i < 0 else i for i in flat]
        if not flat:
            raise OutOfRangeError(f"no element to get: the index {index!r} names no slot")
        leaves = self._cached_leaves(flat)
        layout = self._layout
        if leaves is None:
            found = self._read(flat)
            layout = self._layout_of(found[flat[0]][0])
            assert layout is not None
            leaves = self._blob_leaves(flat, found, layout)
            if leaves is None:  # not the plain layout: the codec reads the rows
                keys = [found[slot][0] for slot in flat]
                paths = [f"exp_data.state.l{i}" for i in range(len(layout.keys) or 1)]
                fetched = self.buffer.sql.fetch_columns(keys, paths)[1]
                leaves = [torch.cat(list(column)) for column in fetched]
        assert layout is not None
        return _join(layout, leaves, shape)

    def _read(self, slots: list[int]) -> dict[int, tuple[int, str, Any]]:
        """Each slot's row (key, id, tensor blob), in one statement (OutOfRangeError names
        the slots no row fills)."""
        handle = self.buffer.sql.handle
        wanted = sorted(set(slots))
        wanted_columns = (rows.c.step, rows.c.key, rows.c.id, rows.c.tensors)
        with handle.errors("read slots"), handle.read() as conn:
            found = _slot_rows(handle, conn, wanted, *wanted_columns)
        held = {int(step): (int(key), rid, blob) for step, key, rid, blob in found}
        missing = [s for s in wanted if s not in held]
        if missing:
            raise _missing_slots(self.name, missing, len(held), len(wanted))
        return held

    def _moved(
        self,
        before: tuple[Any, ...],
        after: tuple[Any, ...],
        written: dict[int, int],
        replaced: int,
    ) -> None:
        """After this process's write committed: the slot map moved on by it, if it was
        current when the write began (``before``: the counters then; an empty buffer
        starts one) and the write changed nothing but its slots (``replaced``: the rows it
        removed from them; a retention that evicted other rows in the write, say, drops
        the map)."""
        held = self._map
        if held is None or held.pid != os.getpid() or len(held.keys) != self.max_size:
            held = _SlotMap(self.max_size, before) if before[2] == 0 else None
        added, count = after[1] - before[1], after[2] - before[2]
        only_slots = added == len(written) and count == len(written) - replaced
        if (
            held is not None
            and only_slots
            and held.counters == before
            and held.put(list(written.items()))
        ):
            held.counters = after
            self._map = held
        else:
            self._map = None

    def _slot_keys(self, slots: list[int]) -> list[int]:
        """The key of the row each slot holds (OutOfRangeError names slots no row fills).

        One row's read says whether the slot map is current (the buffer's counters): if
        so, the map answers; rows only added since (another process filling slots) are
        read and noted; any other change drops the map, and the slot index answers, until
        two reads in a row find the buffer unchanged, which read the whole slot index into
        a new map. Each statement on its own (no transaction: one round trip each on
        Postgres), on the primary; the counters first, so what is read after them is as
        new as they say or newer (a map newer than its counters is only read again)."""
        handle = self.buffer.sql.handle
        held = self._map
        if held is not None and (held.pid != os.getpid() or len(held.keys) != self.max_size):
            held = None
        with handle.errors("read slots"), handle.single() as conn:
            now = _counters(handle, conn)
            if held is not None and held.counters != now:
                held = self._caught_up(conn, held, now)
            if held is None and now == self._quiet:
                held = _SlotMap(self.max_size, now)
                if not held.put(_all_slot_rows(handle, conn)):
                    held = None
            self._map, self._quiet = held, now
            if held is None or min(slots) < 0 or max(slots) >= self.max_size:
                wanted = sorted(set(slots))
                found = _slot_rows(handle, conn, wanted, rows.c.step, rows.c.key)
                key_of = {int(step): int(key) for step, key in found}
                if len(key_of) < len(wanted):
                    missing = [s for s in wanted if s not in key_of]
                    raise _missing_slots(self.name, missing, len(key_of), len(wanted))
                return [key_of[slot] for slot in slots]
        keys = held.keys[np.asarray(slots, np.int64)]
        if (keys < 0).any():
            empty = sorted({s for s, k in zip(slots, keys.tolist(), strict=True) if k < 0})
            asked = len(set(slots))
            raise _missing_slots(self.name, empty, asked - len(empty), asked)
        return keys.tolist()  # type: ignore[no-any-return]

    def _caught_up(self, conn: Any, held: _SlotMap, now: tuple[Any, ...]) -> _SlotMap | None:
        """``held`` brought up to the counters ``now`` when since then rows were only added
        (the version, the creation the same, as many rows more as were inserted): the
        storage's rows above the largest key it knew, each into a slot it had empty;
        else None."""
        version, inserted, count, created = now
        was = held.counters
        if (version, created) != (was[0], was[3]) or count - was[2] != inserted - was[1]:
            return None  # rows went, or the database was made anew
        found = _slot_rows_after(self.buffer.sql.handle, conn, held.max_key)
        if not held.put(found, into_empty=True):
            return None
        held.counters = now
        return held

    def _cached_leaves(self, slots: list[int]) -> list[Any] | None:
        """The leaves, batched, through the row cache: one statement reads which rows the
        slots hold (the slot index alone), the cache gives the leaves of the rows it holds
        (rows never change: a key is one row for good), and the others are cut out of
        their blobs (and kept). None when the cache is off, the rows' layout is not the
        plain one, or a row went between the two reads (the caller reads by slot)."""
        sql = self.buffer.sql
        cache = sql.row_cache
        if not cache.enabled:
            return None
        handle = sql.handle
        keys = self._slot_keys(slots)
        layout = self._layout_of(keys[0])
        assert layout is not None
        if layout.plan is None:
            layout.plan = self._plan(keys[0], layout)
        if not layout.plan:
            return None
        size, parts = layout.plan
        plain = [True]

        def read(some: list[int], _paths: Any, _writable: bool) -> tuple[list[str], list[Any]]:
            with handle.errors("read slots"), handle.single() as conn:
                got = {
                    int(k): (rid, blob)
                    for k, rid, blob in _key_rows(handle, conn, sorted(set(some)))
                }
            present = [k for k in some if k in got]
            table = _blob_table([got[k] for k in present], size)
            if table is None:
                plain[0] = False
                return [], [[]]
            ids = [got[k][0] for k in present]
            return ids, [np.concatenate([table[:, a:b] for a, b, _, _ in parts], axis=1)]

        if layout.cached_as is None:
            layout.cached_as = _cache_path(layout, [(dtype, shape) for _, _, dtype, shape in parts])
        ids, (packed,), _ = cache.fetch_columns(sql.identity, keys, [layout.cached_as], True, read)
        n = len(slots)
        width = sum(stop - start for start, stop, _, _ in parts)
        if not plain[0] or len(ids) != n:
            return None
        if type(packed) is not np.ndarray or packed.shape != (n, width):
            return None  # (rows of another form under this name: read by slot)
        leaves, at = [], 0
        for start, stop, dtype, shape in parts:
            raw = packed[:, at : at + stop - start].copy()  # its own, writable
            leaves.append(torch.from_numpy(raw).view(dtype).reshape((n, *shape)))
            at += stop - start
        return leaves

    def _blob_leaves(
        self, slots: list[int], found: dict[int, tuple[int, str, Any]], layout: _Layout
    ) -> list[Any] | None:
        """The leaves, batched, cut straight out of the rows' blobs (the stored format,
        ``docs/format.md``: a checksummed header, then each tensor at its offset), when
        every row has the layout the first row's document gives; else None."""
        plan = layout.plan
        if plan is None:
            plan = layout.plan = self._plan(found[slots[0]][0], layout)
        if not plan:
            return None
        size, parts = plan
        distinct = list(dict.fromkeys(slots))
        table = _blob_table([found[slot][1:] for slot in distinct], size)
        if table is None:
            return None  # damaged, or another layout: the codec says what it is
        if len(distinct) < len(slots):
            at = {slot: i for i, slot in enumerate(distinct)}
            table = table[[at[slot] for slot in slots]]
        leaves = []
        for start, stop, dtype, shape in parts:
            raw = torch.from_numpy(table[:, start:stop].copy())  # its own, writable
            leaves.append(raw.view(dtype).reshape((len(slots), *shape)))
        return leaves

    def _plan(
        self, key: int, layout: _Layout
    ) -> tuple[int, list[tuple[int, int, Any, list[int]]]] | tuple[()]:
        """Where each leaf is in a row's blob (from the row's document), and the blob's
        length; ``()`` when a leaf is not a plain tensor in the blob."""
        handle = self.buffer.sql.handle
        stmt = select(rows.c.data, rows.c.tensors).where(rows.c.key == key)
        with handle.errors("read a slot's layout"), handle.read() as conn:
            data, blob = conn.execute(stmt).one()
        doc = json.loads(data) if isinstance(data, str) else data
        parts = []
        for i in range(len(layout.keys) or 1):
            spec = doc.get("state", {}).get(f"l{i}", {}).get("__tensor__")
            if not spec or spec.get("kind") != "torch" or "offset" not in spec:
                return ()
            dtype = getattr(torch, spec["dtype"], None)
            if not isinstance(dtype, torch.dtype) or dtype.is_complex:
                return ()
            start = HEADER_SIZE + int(spec["offset"])
            parts.append((start, start + int(spec["nbytes"]), dtype, list(spec["shape"])[1:]))
        if not parts:
            return ()
        return len(blob), parts

    def _layout_of(self, key: int | None) -> _Layout | None:
        if self._layout is None and key is not None:
            fetched = self.buffer.sql.fetch_columns([key], [LAYOUT_PATH])[1][0]
            if not fetched or not isinstance(fetched[0], str):
                raise StorageError(
                    f"the row in slot of key {key} of buffer {self.name!r} was not written "
                    "by ExpstoreStorage (no exp_data.state.torchrl); use a buffer of "
                    "its own for a TorchRL storage"
                )
            self._layout = _Layout.parse(fetched[0])
        return self._layout

    def __len__(self) -> int:
        # A full storage stays full (slots are overwritten, never removed, but by _empty),
        # so once full, len() asks the database nothing.
        if self._full:
            return self.max_size
        handle = self.buffer.sql.handle

        def build() -> Any:  # the row count every write keeps on the buffer's row
            return select(buffers.c.row_count).where(buffers.c.id == handle.buffer_id)

        with handle.errors("count slots"), handle.read() as conn:
            ((count,),) = handle.statement(("torchrl count",), build).run(conn)
        size = min(int(count), self.max_size)
        self._full = size == self.max_size
        return size

    def _empty(self) -> None:
        self.buffer.clear()
        self._full, self._map = False, None
        self._bump_mutation_revision()

    def state_dict(self) -> dict[str, Any]:
        """Where the rows are (url, buffer name), the number of slots and the last cursor:
        the rows themselves are in the database, committed."""
        last = self._last_cursor_index
        return {
            "url": self.url,
            "name": self.name,
            "max_size": self.max_size,
            "last_cursor": None if last is None else int(last),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Open the buffer ``state_dict`` names (the rows are read from there)."""
        if (state_dict["url"], state_dict["name"]) != (self.url, self.name):
            self.url, self.name = state_dict["url"], state_dict["name"]
            self._opened, self._layout = None, None
        self._full, self._map = False, None
        self.max_size = int(state_dict["max_size"])
        self._set_last_cursor(state_dict.get("last_cursor"))
        self._bump_mutation_revision()

    def contains(self, item: Any) -> Any:
        size = len(self)
        if isinstance(item, int):
            return 0 <= (item + size if item < 0 else item) < size
        if isinstance(item, torch.Tensor):
            return (item >= -size) & (item < size)
        raise UnsupportedTypeError(
            f"contains() takes an int or a tensor of slots; got {type(item).__name__}"
        )

    def attach(self, buffer: Any) -> None:
        # get() returns stacked batches, as TorchRL's tensor storages do, so a buffer
        # given no collate_fn collates with the identity (TorchRL's default for them).
        if getattr(buffer, "_init_collate_fn", False) is None:
            buffer._init_collate_fn = _identity
        super().attach(buffer)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(max_size={self.max_size}, url={self.url!r}, name={self.name!r})"
        )


def _identity(batch: Any) -> Any:
    return batch
