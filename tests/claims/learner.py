"""A learner process for the claims tests: claims batches, "trains", acks each with a
checkpoint counting the rows it acked, and stops when every row of the buffer is consumed.

    python -m tests.claims.learner URL BUFFER CONSUMER BATCH STEP_S [OUT]

Each "training step" sleeps up to STEP_S seconds. With OUT, the ids of each acked claim
are appended to that file (one JSON list per line) after the ack returns.
"""

from __future__ import annotations

import json
import random
import sys
import time

from expstore import ReplayBuffer
from expstore.errors import LeaseExpiredError

LEASE_S = 1.0


def main(
    url: str, name: str, consumer: str, batch: int, step_s: float, out: str | None = None
) -> None:
    rng = random.Random()
    with ReplayBuffer(url, name=name) as buffer:
        state = buffer.checkpoint(consumer, default={"acked": 0, "claims": 0})
        while True:
            claim = buffer.claim(batch, consumer=consumer, lease_s=LEASE_S, order="oldest")
            if not len(claim):
                stats = buffer.queue_stats()
                if stats.consumed == stats.total:
                    return
                time.sleep(0.05)  # rows held by others, or a dead learner's lease
                continue
            time.sleep(rng.random() * step_s)  # a training step
            step = {"acked": state["acked"] + len(claim), "claims": state["claims"] + 1}
            try:
                claim.ack(checkpoint=step)
            except LeaseExpiredError:
                # The step outlasted the lease (a loaded machine) and another learner has
                # the rows now: nothing was acked, as a real learner would find it.
                continue
            state = step
            if out:
                with open(out, "a") as f:
                    f.write(json.dumps(claim.ids) + "\n")


if __name__ == "__main__":
    main(
        sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), *sys.argv[6:7]
    )
