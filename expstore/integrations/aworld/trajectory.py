"""ExpstoreTrajectoryStorage: AWorld's ``TrajectoryStorage`` on expstore, made with no
arguments, so a task's trajectory goes to a database with one line::

    from expstore.integrations.aworld import ExpstoreTrajectoryStorage
    conf = TaskConfig(trajectory_storage=ExpstoreTrajectoryStorage)
    task = Task(input="...", agent=agent, conf=conf)

The database is ``$EXPSTORE_URL`` (``sqlite:///...`` or ``postgresql+psycopg://...``), by
default the SQLite file ``expstore_aworld.db`` in the current directory; the buffer is
``$EXPSTORE_BUFFER``, by default ``aworld_trajectories``. Each step (a ``TrajectoryItem``) is
an ordinary expstore row, laid out field by field as
:class:`~expstore.integrations.aworld.rows.TrajectoryLayout` says (task, agent, step, time,
the chat messages, the tool calls as actions, the score as ``reward_t``, the session id in
``ext_info.aworld.session_id``), so ``ReplayBuffer(url, name="aworld_trajectories")`` samples,
claims, exports and shows them like any rows. ``get_data_items`` gives a task's steps by
step, then time; ``select_data`` by step, then as stored.

What AWorld 0.3.2's runner does, and what this storage does about it:

- It builds one storage per task (``TaskConfig`` takes the class), inside the running event
  loop, and never closes it. All instances of one database and buffer in a process share
  one handle (opened by the first, closed at exit), so a thousand tasks hold one pool of
  connections, not a thousand.
- A class whose constructor raises TypeError or ValueError is silently replaced by an
  in-memory store. A database that cannot be opened is therefore logged here as an error
  (logger ``expstore.integrations.aworld``) and raised as a
  :class:`~expstore.errors.StorageError`, which is neither: the task fails, saying why,
  instead of running with its trajectory kept nowhere.
- Each step is written three times under one item id (``overwrite=True``), each write an
  asyncio task nothing awaits; ``Runners.sync_run_task`` closes its loop at the end,
  cancelling what is still pending. So writes are done before the coroutine first yields
  (``blocking_writes=True``): a write whose task is cancelled right after has been stored.
  The cost is the write itself on the event loop, once per step version (about a
  millisecond on SQLite; ``benchmarks/bench_aworld.py`` measures it); reads still run on
  the buffer's thread.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading

from aworld.config import StorageConfig
from aworld.dataset.trajectory_storage import TrajectoryStorage

from ...aio import AsyncReplayBuffer
from ...errors import StorageError
from .rows import TrajectoryLayout
from .storage import ExpstoreStorage, ExpstoreStorageConfig

__all__ = [
    "DEFAULT_BUFFER",
    "DEFAULT_URL",
    "ENV_BUFFER",
    "ENV_URL",
    "ExpstoreTrajectoryStorage",
]

logger = logging.getLogger("expstore.integrations.aworld")

#: The environment variable naming the database.
ENV_URL = "EXPSTORE_URL"
#: The environment variable naming the buffer.
ENV_BUFFER = "EXPSTORE_BUFFER"
#: The database without ``$EXPSTORE_URL``: a SQLite file in the current directory.
DEFAULT_URL = "sqlite:///expstore_aworld.db"
#: The buffer without ``$EXPSTORE_BUFFER``.
DEFAULT_BUFFER = "aworld_trajectories"

_shared: dict[tuple[str, str, int], AsyncReplayBuffer] = {}
_shared_lock = threading.Lock()


def _shared_buffer(url: str, name: str) -> AsyncReplayBuffer:
    """The process's one handle of buffer ``name`` at ``url`` (opened on first use)."""
    key = (url, name, os.getpid())
    with _shared_lock:
        buffer = _shared.get(key)
        if buffer is None:
            buffer = _shared[key] = AsyncReplayBuffer(url, name=name)
        return buffer


@atexit.register
def _close_shared() -> None:
    with _shared_lock:
        for (_, _, pid), buffer in list(_shared.items()):
            if pid == os.getpid():
                buffer.sync.close()
        _shared.clear()


class ExpstoreTrajectoryStorage(ExpstoreStorage, TrajectoryStorage):  # type: ignore[misc]
    """AWorld's ``TrajectoryStorage`` on expstore (see the module's docstring).

    ``ExpstoreTrajectoryStorage(conf=None, *, url=None, name=None)``: ``url`` defaults to
    ``$EXPSTORE_URL``, else :data:`DEFAULT_URL`; ``name`` to ``$EXPSTORE_BUFFER``, else
    :data:`DEFAULT_BUFFER`. The block of a task's steps is ``trajectory_<task id>``, as
    AWorld's ``TrajectoryDataset`` names it.
    """

    layout = TrajectoryLayout()

    def __init__(
        self,
        conf: StorageConfig | None = None,
        *,
        url: str | None = None,
        name: str | None = None,
    ) -> None:
        url = url or os.environ.get(ENV_URL) or DEFAULT_URL
        name = name or os.environ.get(ENV_BUFFER) or DEFAULT_BUFFER
        try:
            buffer = _shared_buffer(url, name)
        except Exception as exc:  # noqa: BLE001 - any failure to open is reported alike
            logger.error(
                "ExpstoreTrajectoryStorage cannot open buffer %r at %s: %s "
                "(set %s to a database it can open)",
                name,
                url,
                exc,
                ENV_URL,
            )
            raise StorageError(
                f"ExpstoreTrajectoryStorage cannot open buffer {name!r} at {url}: {exc}; set "
                f"{ENV_URL} to a database URL it can open (sqlite:///path.db, "
                "postgresql+psycopg://user@host/db)"
            ) from exc
        super().__init__(
            buffer,
            conf=conf if conf is not None else ExpstoreStorageConfig(name="expstore_trajectory"),
            blocking_writes=True,
        )

    def _open_blocks(self) -> AsyncReplayBuffer:
        sql = self.buffer.sync.sql
        return _shared_buffer(sql.url.render_as_string(hide_password=False), f"{sql.name}.blocks")

    async def aclose(self) -> None:
        """Nothing: the handle is the process's, shared by every instance (closed at exit)."""
