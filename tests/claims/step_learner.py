"""A learner process for the training-step kill tests: opens its consumer, claims two
batches, and commits one step (both acks, a checkpoint, a policy version, priorities),
killing itself with SIGKILL when the step reaches the part named on the command line.

    python -m tests.claims.step_learner URL BUFFER PART

PART is a name :data:`expstore.claims.steps.after_part` is called with
("fenced", "checkpoint", "ack 0", "ack 1", "policy version", "priorities", "committed"):
the kill lands at that point of the step's execution, not at a moment in time.
"""

from __future__ import annotations

import os
import signal
import sys

from expstore import ReplayBuffer
from expstore.claims import steps

CONSUMER = "learner"
#: Rows each claim takes, the version the step publishes and the priority it sets.
BATCH, VERSION, PRIORITY = 3, 5, 7.5


def main(url: str, name: str, part: str) -> None:
    def stop_at(reached: str) -> None:
        if reached == part:
            os.kill(os.getpid(), signal.SIGKILL)

    steps.after_part = stop_at
    with ReplayBuffer(url, name=name) as buffer:
        learner = buffer.consumer(CONSUMER)
        claims = [learner.claim(BATCH, lease_s=3600) for _ in range(2)]
        with learner.step() as step:
            for claim in claims:
                step.ack(claim)
            step.save_checkpoint({"step": 1})
            step.set_policy_version(VERSION)
            step.update_priorities(claims[0].ids + claims[1].ids, [PRIORITY] * 2 * BATCH)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
