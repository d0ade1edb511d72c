"""The storage's tuning knobs: how much is kept or read at a time, never what a buffer
holds or the distribution a draw follows. Tests and measurements set them on one storage
(``SqlStorage(url, tuning=Tuning(...))``, ``ReplayBuffer(url, tuning=...)``); everyone
else keeps the defaults."""

from __future__ import annotations

from dataclasses import dataclass, fields

from .._args import check_int

__all__ = ["Tuning"]


@dataclass(frozen=True)
class Tuning:
    """One storage's knobs, held by its handle (``handle.tuning``) for its whole life."""

    #: Ids of rows read lately whose keys a handle keeps (see
    #: :meth:`~expstore.db.handle.BufferHandle.remember_keys`).
    recent_keys: int = 16384
    #: How many priority updates a buffer's log keeps, pruned by the handle that updates;
    #: a reader further behind reloads (see :mod:`expstore.priorities`).
    priority_log_keep: int = 64
    #: Where fresh rows lie is worked out over at most this many policy versions (one
    #: index probe each); beyond it a draw does without (see
    #: :class:`~expstore.policy_versions.FreshBounds`).
    fresh_versions: int = 1024
    #: A task left with more rows than this, whose extremes or last row a delete took, is
    #: marked dirty instead of summarised again at once (which reads all its rows; see
    #: :mod:`expstore.stats.task_stats`).
    recompute_limit: int = 1000
    #: Keys (or other values) bound per statement when probing or listing (drivers cap
    #: bound parameters; see :mod:`expstore.storage.key_space`).
    probe_chunk: int = 5000

    def __post_init__(self) -> None:
        for field in fields(self):
            check_int(f"Tuning.{field.name}", getattr(self, field.name), minimum=1)
