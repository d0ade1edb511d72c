"""A process on one "host" of the test cluster
(``ip netns exec <ns> python -m tests.multihost.node ...``):

- ``actor URL NAME ACTOR BATCHES PROGRESS``: stores batches ``0 .. BATCHES-1`` of 20 rows
  with ids ``ACTOR-b-i``, noting each batch stored in the file PROGRESS on its own disk
  after the write commits, and resuming after the last batch noted (a restart after SIGKILL
  goes on where it stopped: the batch whose note the kill prevented is written again and
  ``dedup="skip"`` leaves it out). A failed write (a connection killed under it) is retried
  the same way, so a write whose commit landed before the error is not stored twice.
  Prints ``done``.
  While the file PROGRESS.hold exists it waits before its next batch (touching
  PROGRESS.holding), so a test can kill it mid-run at a known point.
- ``prompts URL NAME ACTOR STOP``: an actor of a prompt queue (buffer NAME, completions
  into NAME_out): claims a prompt, makes what it still needs (ids ``<prompt>/c<i>``),
  and stores them with the prompt's ack, until the file STOP exists. An error of the
  database (its primary SIGKILLed under it) is waited out and the ack retried: one whose
  commit landed before the error finds its claim acked (ClaimFinishedError) and stores
  nothing twice; one whose lease ran out meanwhile gives the prompt up to its next
  claimer. Prints ``done`` and how many acks it retried.
- ``learner URL NAME REPLICA STOP OUT``: samples 64 rows every few ms from the replica
  until the file STOP exists, writing every id it was given to OUT (one per line); any
  error is fatal.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer, StorageError
from expstore.samplers import UniformSampler

ROWS = 20


def batch(actor: str, b: int) -> list[DataRow]:
    return [
        DataRow(
            id=f"{actor}-{b}-{i}",
            exp_meta=ExpMeta(task_id=f"{actor}-{b}", agent_id=actor, step=i),
            exp_data=Experience(state={"b": b, "i": i}, reward_t=float(i)),
        )
        for i in range(ROWS)
    ]


def actor(url: str, name: str, who: str, batches: int, progress: str) -> None:
    path = Path(progress)
    start = int(path.read_text() or 0) if path.exists() else 0
    hold, holding = Path(progress + ".hold"), Path(progress + ".holding")
    with ReplayBuffer(url, name=name) as buffer:
        for b in range(start, batches):
            while hold.exists():  # the test stops the actor here (to kill it mid-run)
                holding.touch()
                time.sleep(0.01)
            rows = batch(who, b)
            for attempt in range(50):
                try:
                    buffer.store_batch(rows, dedup="skip")
                    break
                except StorageError:
                    if attempt == 49:
                        raise
                    time.sleep(0.05)
            with open(path, "w") as note:
                note.write(str(b + 1))
                note.flush()
                os.fsync(note.fileno())
    print("done", flush=True)


def prompt_actor(url: str, name: str, who: str, stop: str) -> None:
    from expstore import ExpstoreError

    retried = [0]
    while not os.path.exists(stop):
        try:  # the primary may be down when this host starts: open again until it is up
            with (
                ReplayBuffer(url, name=name) as prompts,
                ReplayBuffer(url, name=name + "_out") as out,
            ):
                _prompt_loop(prompts, out, who, stop, retried)
        except ExpstoreError:
            time.sleep(0.2)
    print("done", retried[0], flush=True)


def _prompt_loop(
    prompts: ReplayBuffer, out: ReplayBuffer, who: str, stop: str, retried: list[int]
) -> None:
    from expstore import ClaimFinishedError, ExpstoreError, LeaseExpiredError

    while not os.path.exists(stop):
        try:
            claim = prompts.claim(1, consumer=who, lease_s=20)
            if not claim.ids:
                time.sleep(0.02)
                continue
            pid = claim.ids[0]
            need = claim.needs[pid]
        except ExpstoreError:  # the primary is down: wait for it
            time.sleep(0.1)
            continue
        target = 4
        made = [
            DataRow(
                id=f"{pid}/c{i}",
                exp_meta=ExpMeta(task_id=pid, agent_id=who, step=i),
                exp_data=Experience(state={"tokens": list(range(i, i + 64))}),
            )
            for i in range(target - need, target)
        ]
        for _ in range(600):
            try:
                claim.ack(produce={pid: made}, into=out)
                break
            except (ClaimFinishedError, LeaseExpiredError):
                break  # committed before the error, or the prompt went to another
            except ExpstoreError:
                retried[0] += 1
                time.sleep(0.1)


def learner(url: str, name: str, replica: str, stop: str, out: str) -> None:
    warnings.simplefilter("ignore")  # replica warnings are expected while it is killed
    seen = 0
    with ReplayBuffer(url, name=name, read_urls=[replica]) as buffer, open(out, "w") as ids:
        sampler = UniformSampler()
        while not os.path.exists(stop):
            try:
                rows = buffer.sample(sampler, batch_size=64)
            except Exception as exc:  # noqa: BLE001 - only "nothing stored yet" is allowed
                if type(exc).__name__ == "EmptyBufferError":
                    time.sleep(0.01)
                    continue
                raise
            ids.writelines(r.id + "\n" for r in rows)
            ids.flush()
            seen += len(rows)
            time.sleep(0.005)
    print("done", seen, flush=True)


if __name__ == "__main__":
    role, *args = sys.argv[1:]
    if role == "actor":
        actor(args[0], args[1], args[2], int(args[3]), args[4])
    elif role == "prompts":
        prompt_actor(args[0], args[1], args[2], args[3])
    else:
        learner(args[0], args[1], args[2], args[3], args[4])
