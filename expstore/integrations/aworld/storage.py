"""ExpstoreStorage: AWorld 0.3's ``Storage`` on an expstore buffer (SQLite or Postgres).

::

    from aworld.core.storage.data import Data
    from expstore.integrations.aworld import ExpstoreStorage

    storage = ExpstoreStorage("sqlite:///items.db")           # or postgresql+psycopg://...
    await storage.create_data(Data(id="d1", value=Step(task_id="t1", score=0.5)), "b1")
    await storage.select_data({"field": "score", "value": 0.4, "op": "gt"})   # SQL

Every method does what AWorld's in-memory storage (``InmemoryStorage``) does, answer for
answer: blocks are created by ``create_block`` or by the first item written to them;
``overwrite=False`` refuses an item id its block holds, ``exists=True`` an update or delete
of one it does not; ``delete_block`` takes the block's items with it; ``add_data`` and
``get_data`` store and return raw values (each a ``Data`` whose id is AWorld's import-time
default, so they replace each other in a block, as in AWorld); ``get_data_items`` gives a
block's items in the order they were first written (an overwrite keeps the place). What
differs: nothing is evicted (AWorld's in-memory store keeps at most 10,000 blocks of 1,000
items; give the buffer a ``capacity`` for a bound), ``select_data`` gives items in the order
they were first written (AWorld's goes block by block), and conditions run in the database (see
:mod:`expstore.integrations.aworld.conditions`), with the buffer's indexes
(``storage.buffer.sync.create_index("exp_data.state.task_id")`` indexes a value's field).

Items are rows of the buffer (see :mod:`expstore.integrations.aworld.rows`), so expstore
reads them as any rows (``ReplayBuffer(url, name=...)``: query, sample, claim, export, the
viewer); blocks are rows of a second buffer, ``<name>.blocks``. An item overwritten is a
new row under the same id, written with the old one's delete in one transaction.

Each call runs on the buffer's own thread (:class:`expstore.aio.AsyncReplayBuffer`), so the
event loop never waits for the database, except writes of a storage made with
``blocking_writes=True`` (:class:`~expstore.integrations.aworld.ExpstoreTrajectoryStorage`
is): those are done before the coroutine first yields, so a write whose task is never
awaited (AWorld's trajectory writes) is stored even if its task is cancelled at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from aworld.config import StorageConfig
from aworld.core.storage.base import Storage
from aworld.core.storage.data import DataBlock

from ...aio import AsyncReplayBuffer
from ...buffer import ReplayBuffer
from ...errors import DuplicateIdError
from ...model.rows import DataRow, Experience, ExpMeta
from ...query import And, Comparison, Condition
from ...storage.sql import SqlStorage
from .conditions import compile_condition
from .rows import AGENT, KEY, ItemLayout, block_of, item_id, row_id

__all__ = ["ExpstoreStorage", "ExpstoreStorageConfig", "replace_rows"]

logger = logging.getLogger("expstore.integrations.aworld")
T = TypeVar("T")


class ExpstoreStorageConfig(StorageConfig):  # type: ignore[misc]
    """AWorld's ``StorageConfig`` for :class:`ExpstoreStorage`: ``name`` is the storage's
    name (AWorld's ``await storage.name()``), not the buffer's."""

    name: str = "expstore"


def replace_rows(buffer: ReplayBuffer, rows: list[DataRow]) -> None:
    """Store ``rows``, each replacing the stored row of its id if there is one, in one
    transaction (:meth:`expstore.SqlStorage.replace`)."""
    buffer.sql.replace(rows)


def _by_id(rid: str) -> Condition:
    return Comparison("id", "eq", rid)


class ExpstoreStorage(Storage):  # type: ignore[misc]
    """AWorld's ``Storage`` over an expstore buffer (see the module's docstring).

    ``ExpstoreStorage(url="sqlite://", *, name="aworld", conf=None, blocking_writes=False,
    **buffer_options)``

    - ``url``: the database (``sqlite:///path.db``, ``postgresql+psycopg://...``); the
      default is a fresh in-memory SQLite database. A :class:`~expstore.ReplayBuffer` or
      :class:`~expstore.aio.AsyncReplayBuffer` is used as it is (its database and name).
    - ``name``: the buffer of the database that holds the items (blocks: ``<name>.blocks``).
    - ``conf``: AWorld's ``StorageConfig`` (default :class:`ExpstoreStorageConfig`).
    - ``blocking_writes``: do writes on the calling thread, before the coroutine yields.
    - ``buffer_options``: the rest of :class:`~expstore.ReplayBuffer`'s options
      (``capacity``, ``eviction``...).
    """

    layout: ItemLayout = ItemLayout()

    def __init__(
        self,
        url: Any = "sqlite://",
        *,
        name: str = "aworld",
        conf: StorageConfig | None = None,
        blocking_writes: bool = False,
        **buffer_options: Any,
    ) -> None:
        if isinstance(url, StorageConfig):  # AWorld's own way: Storage(conf)
            url, conf = "sqlite://", url
        super().__init__(conf if conf is not None else ExpstoreStorageConfig())
        if isinstance(url, AsyncReplayBuffer):
            self.buffer = url
        elif isinstance(url, ReplayBuffer):
            self.buffer = AsyncReplayBuffer.wrap(url)
        else:
            self.buffer = AsyncReplayBuffer(url, name=name, **buffer_options)
        self.blocking_writes = blocking_writes
        self._blocks: AsyncReplayBuffer | None = None
        self._known_blocks: set[str] = set()
        #: Row ids this handle stored (their next version replaces them at once).
        self._stored = _Stored()

    # -- AWorld's Storage -----------------------------------------------------------------
    def backend(self) -> AsyncReplayBuffer:
        """The items' buffer, for what AWorld's interface does not say."""
        return self.buffer

    async def delete_all(self) -> None:
        """Delete every item and every block."""
        await self.buffer.run(ReplayBuffer.clear)
        await self.blocks.run(ReplayBuffer.clear)
        self._known_blocks.clear()

    async def create_block(self, block_id: str, overwrite: bool = True) -> bool:
        """Make the block ``block_id`` (made again, empty of nothing, when it exists and
        ``overwrite``); False if it exists and not ``overwrite``."""
        row = self._block_row(DataBlock(id=block_id))
        made = await self._write_blocks(_put_block, row, overwrite)
        if made:
            self._known_blocks.add(str(block_id))
        else:
            logger.warning("block %s exists", block_id)
        return made

    async def delete_block(self, block_id: str, exists: bool = False) -> bool:
        """Delete the block and its items; False if there is no such block."""
        block = str(block_id)
        gone = await self._write_blocks(ReplayBuffer.delete, _by_id(_block_row_id(block)))
        self._known_blocks.discard(block)
        if not gone:
            logger.warning("block %s does not exist", block_id)
            return False
        await self._write(_delete_block_items, self.layout, block)
        return True

    async def get_block(self, block_id: str) -> DataBlock | None:
        """The block (AWorld's ``DataBlock``), or None."""
        row = await self.blocks.run(ReplayBuffer.get, _block_row_id(str(block_id)))
        if row is None:
            return None
        info = row.exp_data.ext_info[KEY]
        return DataBlock(id=info["block"], create_at=info["create_at"], meta_info=info["meta_info"])

    async def create_data(
        self, data: Any, block_id: str | None = None, overwrite: bool = True
    ) -> bool:
        """Store ``data`` in its block (its own ``block_id``, else ``block_id``), making the
        block if needed; an item of the same id is replaced if ``overwrite``, else kept
        (and False returned)."""
        block = block_of(data, block_id)
        await self._ensure_block(block)
        done = await self._write(_create, self.layout, data, block, overwrite, self._stored)
        if not done:
            logger.warning("data %s exists", item_id(data))
        return done

    async def update_data(
        self, data: Any, block_id: str | None = None, exists: bool = False
    ) -> bool:
        """Replace the stored item of ``data``'s id; without one, store nothing and return
        ``not exists``."""
        block = block_of(data, block_id)
        done = await self._write(_update, self.layout, data, block, exists)
        if not done:
            logger.warning("data %s does not exist to update", item_id(data))
        return done

    async def delete_data(
        self,
        data_id: str | None = None,
        data: Any = None,
        block_id: str | None = None,
        exists: bool = False,
    ) -> bool:
        """Delete item ``data_id`` (else ``data``'s) of the block; if neither is there,
        return ``not exists``."""
        block = str(block_id)
        candidates = [str(data_id)] if data_id else []
        if data is not None:
            candidates.append(item_id(data))
        gone = await self._write(_delete_first, [row_id(block, c) for c in candidates])
        if not gone and exists:
            logger.warning("data %s does not exist to delete", data_id)
            return False
        return True

    async def select_data(self, condition: Any = None) -> list[Any]:
        """The items matching ``condition`` (an AWorld condition dict, a ConditionBuilder,
        an expstore Condition; None: every item), found by the database."""
        compiled = compile_condition(condition, self.layout.field_path)
        # the items rebuilt on the buffer's thread too, not on the event loop
        items: list[Any] = await self.buffer.run(_items_of, self.layout, _query, compiled)
        return items

    async def get_data_items(self, block_id: str | None = None) -> list[Any]:
        """The items of the block, in the order they were first written."""
        block = str(block_id)
        items: list[Any] = await self.buffer.run(
            _items_of, self.layout, _block_rows, self.layout, block
        )
        return items

    async def size(self, condition: Any = None) -> int:
        """How many items match ``condition`` (every item for None)."""
        compiled = compile_condition(condition, self.layout.field_path)
        count: int = await self.buffer.run(ReplayBuffer.count, compiled)
        return count

    async def aclose(self) -> None:
        """Close the buffers (the storage is unusable after)."""
        await self.buffer.aclose()
        if self._blocks is not None:
            await self._blocks.aclose()

    # -- blocks ---------------------------------------------------------------------------
    @property
    def blocks(self) -> AsyncReplayBuffer:
        """The buffer of the blocks (opened on first use)."""
        if self._blocks is None:
            self._blocks = self._open_blocks()
        return self._blocks

    def _open_blocks(self) -> AsyncReplayBuffer:
        items = self.buffer.sync.sql
        return AsyncReplayBuffer.wrap(
            ReplayBuffer(SqlStorage(items.url, name=f"{items.name}.blocks"))
        )

    async def _ensure_block(self, block: str) -> None:
        if block in self._known_blocks:
            return
        await self._write_blocks(_put_block, self._block_row(DataBlock(id=block)), False)
        self._known_blocks.add(block)

    @staticmethod
    def _block_row(block: DataBlock) -> DataRow:
        return DataRow(
            id=_block_row_id(str(block.id)),
            exp_meta=ExpMeta(
                task_id=str(block.id), agent_id=AGENT, step=0, execute_time=block.create_at
            ),
            exp_data=Experience(
                ext_info={
                    KEY: {
                        "block": block.id,
                        "create_at": block.create_at,
                        "meta_info": block.meta_info,
                    }
                }
            ),
        )

    # -- where calls run ------------------------------------------------------------------
    async def _write(self, fn: Callable[..., T], *args: Any) -> T:
        if self.blocking_writes:
            return fn(self.buffer.sync, *args)
        result: T = await self.buffer.run(fn, *args)
        return result

    async def _write_blocks(self, fn: Callable[..., T], *args: Any) -> T:
        if self.blocking_writes:
            return fn(self.blocks.sync, *args)
        result: T = await self.blocks.run(fn, *args)
        return result


class _Stored:
    """Row ids a storage stored, the newest :data:`LIMIT` of them: a hint only (a row
    deleted since is replaced by nothing, and its new version inserted alike)."""

    LIMIT = 65_536

    def __init__(self) -> None:
        self._ids: dict[str, None] = {}
        self._lock = threading.Lock()

    def __contains__(self, rid: str) -> bool:
        return rid in self._ids

    def add(self, rid: str) -> None:
        with self._lock:
            self._ids[rid] = None
            if len(self._ids) > self.LIMIT:
                del self._ids[next(iter(self._ids))]


def _block_row_id(block: str) -> str:
    return row_id("", block)


# The calls, run on the buffer's thread (or the caller's, for blocking writes).
def _put_block(buffer: ReplayBuffer, row: DataRow, overwrite: bool) -> bool:
    if overwrite:
        replace_rows(buffer, [row])
        return True
    try:
        buffer.store(row)
    except DuplicateIdError:
        return False
    return True


def _create(
    buffer: ReplayBuffer,
    layout: ItemLayout,
    data: Any,
    block: str,
    overwrite: bool,
    stored: _Stored,
) -> bool:
    if not layout.keeps_position and overwrite:
        # The first version of an item is a plain insert; a later one replaces it (one
        # this handle stored, or one the insert finds stored: then nothing was written).
        row = layout.row(data, block, None)
        if row.id in stored:
            replace_rows(buffer, [row])
            return True
        try:
            buffer.store(row)
        except DuplicateIdError:
            replace_rows(buffer, [row])
        stored.add(row.id)
        return True
    old = buffer.get(row_id(block, item_id(data)))
    if old is not None and not overwrite:
        return False
    replace_rows(buffer, [layout.row(data, block, _position(layout, old))])
    return True


def _update(buffer: ReplayBuffer, layout: ItemLayout, data: Any, block: str, exists: bool) -> bool:
    old = buffer.get(row_id(block, item_id(data)))
    if old is None:
        return not exists
    replace_rows(buffer, [layout.row(data, block, _position(layout, old))])
    return True


def _position(layout: ItemLayout, old: DataRow | None) -> int | None:
    if old is None or not layout.keeps_position:
        return None
    if old.exp_data.ext_info[KEY]["layout"] != "item":
        return None
    return old.exp_meta.step


def _delete_first(buffer: ReplayBuffer, rids: list[str]) -> bool:
    for rid in rids:
        if buffer.delete(_by_id(rid)):
            return True
    return False


def _block_rows(buffer: ReplayBuffer, layout: ItemLayout, block: str) -> list[DataRow]:
    tasks = layout.block_tasks(block)
    if len(tasks) == 1:
        found = buffer.get_by_task_id(tasks[0])
    else:
        by_task = buffer.get_batch_by_task_ids(tasks)
        found = [row for task in tasks for row in by_task.get(task, [])]
        found.sort(key=lambda row: (row.exp_meta.step, row.exp_meta.execute_time))
    return [row for row in found if row.exp_data.ext_info.get(KEY, {}).get("block") == block]


def _items_of(
    buffer: ReplayBuffer, layout: ItemLayout, read: Callable[..., list[DataRow]], *args: Any
) -> list[Any]:
    """The items of the rows ``read(buffer, *args)`` gives."""
    return layout.items(read(buffer, *args))


def _delete_block_items(buffer: ReplayBuffer, layout: ItemLayout, block: str) -> int:
    return buffer.delete(
        And(
            (
                Comparison("task_id", "in", tuple(layout.block_tasks(block))),
                Comparison(f"exp_data.ext_info.{KEY}.block", "eq", block),
            )
        )
    )


def _query(buffer: ReplayBuffer, condition: Condition | None) -> list[DataRow]:
    # By step (an item's position, a trajectory's step): the order the (buffer, task,
    # step) index holds, which a condition on the task reads without a sort (by key,
    # SQLite's planner may walk every row of the buffer in key order instead).
    return list(buffer.query(condition, order_by="step"))
