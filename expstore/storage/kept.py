"""What draws over the key space find about their matching rows, kept by each handle from
draw to draw (for every sampler of the process) while the buffer changes only in ways it
can follow.

A draw target is a condition, ``max_staleness`` and ``consume_after``
(:meth:`KeySpace.condition_key <expstore.storage.key_space.KeySpace.condition_key>`).
Between two draws of a target, rows only leave its matching rows, or new ones arrive
with higher keys, as long as the buffer moved on by inserts, FIFO eviction, priority
updates and draws counted (:func:`~expstore.storage.key_index.moved_on`), and the oldest
fresh version did not go back: evicted, spent and stale rows leave, nothing else changes.
What was found then stays true but for those two changes, which the finder checks
(:mod:`expstore.storage.least_priority`, :mod:`expstore.storage.matching_values`);
anything else (deletes, updates, a policy version set back) finds it again.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, NamedTuple

from .key_index import Signature, moved_on

if TYPE_CHECKING:
    from .key_space import KeySpace

__all__ = ["Kept", "Since"]

#: Findings a handle keeps (the ones used last).
KEPT = 128


class Since(NamedTuple):
    """A finding and the buffer it was found in."""

    found: Any
    signature: Signature
    oldest: int | None  # the oldest fresh version then (None: every row)


class Kept:
    """The findings of one handle's draws, by what was found and the draw target (the
    :data:`KEPT` used last)."""

    def __init__(self) -> None:
        self._kept: OrderedDict[Any, Since] = OrderedDict()

    def get(self, space: KeySpace, what: tuple[Any, ...]) -> Since | None:
        """What was found as ``what`` for ``space``'s target, if the buffer changed since
        only in ways the finder can follow; None when it must be found again."""
        since = self._kept.get((what, space.condition_key()))
        signature = space.signature
        assert signature is not None  # a space read by a key index's freshness check
        if since is None or not moved_on(since.signature, signature):
            return None
        return since if _shrunk(since.oldest, space.oldest) else None

    def put(self, space: KeySpace, what: tuple[Any, ...], found: Any) -> None:
        """Keep ``found`` as ``what`` for ``space``'s target, as of ``space``."""
        assert space.signature is not None
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
