"""A writer process for the tracked changes' kill test: stores rows into a buffer that
tracks ``exp_data.state.url``, with a capacity (so each write evicts, and fixes the flags of
the evicted rows' neighbours), and kills itself with SIGKILL at the point named on the
command line, inside the write's transaction:

- ``before-flags``: the rows inserted, their digests and flags not yet;
- ``after-flags``: digests and flags written, not committed;
- ``before-refresh``: rows evicted (their flags gone with them), neighbours not fixed;
- ``after-refresh``: neighbours fixed, not committed.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from tests.helpers import make_row


def rows_for(batch: int) -> list[Any]:
    """Two trajectories, written out of step order, pages repeating."""
    order = [3, 0, 5, 1, 4, 2]
    return [
        make_row(f"t{(batch + i) % 2}", "w", 10 * batch + s, state={"url": f"p{(s + batch) // 2}"})
        for i, s in enumerate(order)
    ]


def main(url: str, name: str, point: str) -> None:
    from expstore import ReplayBuffer
    from expstore.tracking import changes

    def wrap(name_: str, before: bool) -> None:
        original = getattr(changes, name_)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if before:
                os.kill(os.getpid(), signal.SIGKILL)
            result = original(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGKILL)
            return result

        setattr(changes, name_, wrapped)

    with ReplayBuffer(url, name=name, capacity=8) as buffer:
        buffer.store_batch(rows_for(0))  # committed before any kill
        buffer.store_batch(rows_for(1))
        which, when = {
            "before-flags": ("after_insert", True),
            "after-flags": ("after_insert", False),
            "before-refresh": ("refresh", True),
            "after-refresh": ("refresh", False),
        }[point]
        wrap(which, when)
        buffer.store_batch(rows_for(2))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
