"""Which buffer a sampler's state belongs to: a sampler holds things of the buffer it
draws from (an epoch's progress, the rows it knows spent, the groups it saw taken) and
forgets them when it is next used with another buffer, or with its buffer made anew
(see :attr:`expstore.storage.base.Storage.identity`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..storage.base import Storage

__all__ = ["BufferBound"]


class BufferBound:
    """The part of :class:`~expstore.samplers.base.Sampler` that knows its buffer."""

    def on_buffer(self, storage: Storage) -> bool:
        """Called before each draw and after its choice: forget what this sampler holds
        of the buffer it drew from last (:meth:`forget_buffer`) when ``storage`` reads
        another one, or the same one made anew (see :attr:`Storage.identity`); whether
        it did."""
        now = storage.identity
        seen = self.__dict__.get("_expstore_buffer")
        self._expstore_buffer = now
        if seen is None or _same_buffer(seen, now):
            return False
        self.forget_buffer()
        return True

    def forget_buffer(self) -> None:  # noqa: B027 - a hook samplers with state fill
        """Forget what this sampler holds of the buffer it drew from (an epoch's progress,
        rows known spent, groups seen taken): it draws from another one now. The random
        stream goes on."""


def _same_buffer(seen: tuple[Any, ...], now: tuple[Any, ...]) -> bool:
    """Whether two :attr:`Storage.identity` values name one buffer (an incarnation not
    known on either side counts as the same)."""
    if seen[:-1] != now[:-1]:
        return False
    return seen[-1] is None or now[-1] is None or seen[-1] == now[-1]
