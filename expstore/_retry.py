"""Retry and back-off timing, written once: :class:`Backoff` and a named policy for each
loop that waits (what each loop retries differs and stays with it; how long it pauses, and
for how long or how many times, comes from here).

::

    waiting = CLAIM_POLL.start(timeout)
    while not ready():
        if not waiting.sleep():
            raise WaitTimeoutError(...)
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from time import monotonic, sleep

__all__ = [
    "CLAIM_POLL",
    "CONFLICT",
    "RATE_LIMIT_WAIT",
    "REPLICA_CATCH_UP",
    "SQLITE_BUSY",
    "Backoff",
    "Waiting",
    "interruptible",
]

_waits = threading.local()


@contextmanager
def interruptible(stop: threading.Event) -> Iterator[None]:
    """Within the block, every :meth:`Waiting.sleep` of this thread ends as soon as
    ``stop`` is set and returns False, as if the wait's time were spent (the waiting loop
    gives up, raising its own timeout error). :mod:`expstore.aio` sets it when the
    coroutine awaiting a call running on its thread is cancelled."""
    outer = getattr(_waits, "stop", None)
    _waits.stop = stop
    try:
        yield
    finally:
        _waits.stop = outer


@dataclass(frozen=True)
class Backoff:
    """Pauses of ``first_s`` seconds, each ``factor`` times the one before, never longer
    than ``longest_s``; at most ``attempts`` of them (None: until the caller's timeout)."""

    first_s: float
    factor: float = 1.0
    longest_s: float = math.inf
    attempts: int | None = None

    def start(self, timeout_s: float | None = None) -> Waiting:
        """One wait under this policy, from now, for at most ``timeout_s`` seconds (None:
        no limit but the policy's ``attempts``)."""
        return Waiting(self, timeout_s)


class Waiting:
    """One wait under a :class:`Backoff`: the next pause, the pauses slept, the time spent.
    ``timeout_s`` may be changed between pauses (a limit read again)."""

    def __init__(self, policy: Backoff, timeout_s: float | None) -> None:
        self.policy = policy
        self.timeout_s = timeout_s
        self.started = monotonic()
        self.pause = policy.first_s
        #: Pauses slept so far.
        self.pauses = 0

    def elapsed(self) -> float:
        return monotonic() - self.started

    def remaining(self) -> float | None:
        """Seconds left before ``timeout_s`` (None: no timeout)."""
        return None if self.timeout_s is None else self.timeout_s - self.elapsed()

    def left(self) -> float:
        """Seconds left before the timeout (infinite without one)."""
        if self.timeout_s is None:
            return math.inf
        return self.timeout_s - self.elapsed()

    def sleep(self) -> bool:
        """Sleep the next pause (no longer than the time left) and return True; return False
        at once when the time or the attempts are spent (the caller gives up)."""
        attempts = self.policy.attempts
        left = self.left()
        if left <= 0 or (attempts is not None and self.pauses >= attempts):
            return False
        stop: threading.Event | None = getattr(_waits, "stop", None)
        if stop is None:
            sleep(min(self.pause, left))
        elif stop.wait(min(self.pause, left)):
            return False  # interrupted: the caller gives up
        self.pause = min(self.pause * self.policy.factor, self.policy.longest_s)
        self.pauses += 1
        return True


#: A write the server rolled back for a serialisation failure or a deadlock
#: (:func:`expstore.db.handle.retried`): retried 5 times, after 10, 20, 40, 80, 160 ms.
CONFLICT = Backoff(first_s=0.01, factor=2.0, attempts=5)
#: Waiting for rows to claim or to arrive (:func:`expstore.claims.wait_until`): 5 ms
#: growing by half to 0.5 s, until the caller's timeout.
CLAIM_POLL = Backoff(first_s=0.005, factor=1.5, longest_s=0.5)
#: A sample or a write waiting for a rate limit's budget
#: (:mod:`expstore.limits.counters`): 2 ms growing by half to 0.25 s, until the
#: limiter's timeout.
RATE_LIMIT_WAIT = Backoff(first_s=0.002, factor=1.5, longest_s=0.25)
#: A SQLite file busy (locked by another connection) while it is switched to WAL
#: (:mod:`expstore.db.engine`): every 50 ms, until SQLite's own busy timeout (60 s).
SQLITE_BUSY = Backoff(first_s=0.05)
#: A read-your-writes read waiting for a replica to replay this handle's last write
#: (:mod:`expstore.db.replicas`): 1 ms doubling to 50 ms, until the router's ``wait_s``.
REPLICA_CATCH_UP = Backoff(first_s=0.001, factor=2.0, longest_s=0.05)
