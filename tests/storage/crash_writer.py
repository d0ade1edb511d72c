"""A writer process for the crash tests: stores numbered batches forever, recording each
batch number in a file after its store_batch returned (a committed batch)."""

from __future__ import annotations

import os
import sys

from tests.helpers import make_row

BATCH = 50


def main(url: str, name: str, log: str, start: int) -> None:
    from expstore import ReplayBuffer

    with ReplayBuffer(url, name=name) as buffer, open(log, "a") as out:
        batch = start
        while True:
            rows = [
                make_row(f"b{batch}", "w", i, reward=float(i), state={"pad": "x" * 200})
                for i in range(BATCH)
            ]
            buffer.store_batch(rows)
            out.write(f"{batch}\n")
            out.flush()
            os.fsync(out.fileno())
            batch += 1


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
