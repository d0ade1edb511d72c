"""A writer process for the arrays' kill tests: stores screenshot rows into a buffer with
a capacity (so each write evicts, and sweeps arrays), and kills itself with SIGKILL at the
point named on the command line, inside the write's transaction:

- ``before-arrays``: the rows inserted, their arrays and references not yet;
- ``after-arrays``: arrays and references stored, not committed;
- ``before-sweep``: rows evicted (their references gone with them), arrays not swept;
- ``after-sweep``: arrays swept, not committed.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import numpy as np

from tests.helpers import make_row


def screenshots(count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, 255, (128, 256, 3), dtype=np.uint8) for _ in range(count)]


def rows_for(batch: int, pages: list[np.ndarray]) -> list[Any]:
    return [
        make_row(
            f"b{batch}",
            "w",
            i,
            reward=float(i),
            state={"screen": pages[(batch + i // 2) % len(pages)]},
        )
        for i in range(6)
    ]


def main(url: str, name: str, point: str) -> None:
    from expstore import ReplayBuffer
    from expstore.arrays import stored_once as arrays

    def die(*_: Any, **__: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def wrap(name_: str, before: bool) -> None:
        original = getattr(arrays, name_)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if before:
                die()
            result = original(*args, **kwargs)
            die()
            return result

        setattr(arrays, name_, wrapped)

    pages = screenshots(5)
    with ReplayBuffer(url, name=name, capacity=8) as buffer:
        buffer.store_batch(rows_for(0, pages))  # committed before any kill
        buffer.store_batch(rows_for(1, pages))
        which, when = {
            "before-arrays": ("store_arrays", True),
            "after-arrays": ("store_arrays", False),
            "before-sweep": ("sweep", True),
            "after-sweep": ("sweep", False),
        }[point]
        wrap(which, when)
        buffer.store_batch(rows_for(2, pages))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
