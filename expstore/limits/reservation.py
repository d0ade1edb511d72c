"""A reservation of samples under a buffer's rate limit: counted before a draw or a claim
hands rows out, and given back, in the part not handed out, when it closes.

Reverb's rate limiter counts a sample before the table gives it; a draw that ends up
short (rows deleted before the fetch, a claim that found fewer rows than counted, an error
on the way) must give back what it did not hand out, or the budget leaks. Every draw and
claim does that the same way::

    with storage.reserve_samples() as held:
        waited = held.add(batch_size)   # counted, waiting while the budget is spent
        ...                             # choose, fetch (more may be added)
        held.use(len(rows))             # handed out
    # closed: the counted samples not used are given back; all of them if the block raised

A claim's rows may come back later, unconsumed (a release, prompts short of their target):
:meth:`Reservation.later` gives back to the limit they were counted under, from any thread.
A buffer without a rate limit counts nothing and gives nothing back: a reservation then
costs no statement.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

__all__ = ["Counter", "Reservation"]


class Counter(Protocol):
    """Counts ``n`` samples against a limit, waiting while it is spent: (how many were
    counted, 0 without a limit; whether it waited)."""

    def __call__(self, n: int, /, *args: Any, **options: Any) -> tuple[int, bool]: ...


class Reservation:
    """Samples counted for one draw or claim (see the module). ``count``: the counter;
    ``give_back(n)``: returns ``n`` counted samples; ``later``: makes a ``give_back``
    bound to the limit the samples were counted under (for rows handed out now that may
    come back later), or None when any ``give_back`` will do."""

    def __init__(
        self,
        count: Counter,
        give_back: Callable[[int], None],
        later: Callable[[], Callable[[int], None]] | None = None,
    ) -> None:
        self._count = count
        self._give_back = give_back
        self._later = later
        #: Samples counted and not given back yet.
        self.counted = 0
        #: Whether anything was asked of the limit yet (a draw asks again only for more).
        self.asked = False
        self._used = 0

    def add(self, n: int, *args: Any, **options: Any) -> bool:
        """Count ``n`` more samples (``args`` and ``options`` go to the counter); returns
        whether the count had to wait (the caller then chooses its rows again)."""
        got, waited = self._count(n, *args, **options)
        self.asked = True
        self.counted += got
        return waited

    def use(self, n: int) -> None:
        """``n`` of the counted samples are handed out; the rest go back on closing."""
        self._used = max(0, min(n, self.counted))

    def close(self, failed: bool = False) -> None:
        """Give back what was counted and not used (everything, if ``failed``)."""
        back = self.counted - (0 if failed else self._used)
        self.counted -= back
        if back > 0:
            self._give_back(back)

    def later(self) -> Callable[[int], None] | None:
        """For rows this reservation handed out that may come back unconsumed: a function
        that gives ``n`` of their samples back to the limit they were counted under, from
        any thread; None when nothing was counted."""
        if not self.counted:
            return None
        return self._give_back if self._later is None else self._later()

    def __enter__(self) -> Reservation:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(failed=exc is not None)
