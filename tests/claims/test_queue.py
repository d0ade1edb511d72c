"""Claims across processes: concurrent claimers never share a row, and learners killed
with SIGKILL at random moments and restarted from their checkpoints consume every row
exactly once, with each checkpoint matching what its consumer acked."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from expstore import ReplayBuffer
from tests.helpers import make_rows

ROOT = Path(__file__).resolve().parents[2]
#: SIGKILLs per backend; set EXPSTORE_CLAIM_KILLS higher for a longer hunt.
KILLS = int(os.environ.get("EXPSTORE_CLAIM_KILLS", "12"))


def start(
    url: str, name: str, consumer: str, batch: int, step_s: float, out: Path | None = None
) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "tests.claims.learner", url, name, consumer, str(batch)]
    args.append(str(step_s))
    if out is not None:
        args.append(str(out))
    return subprocess.Popen(args, cwd=ROOT)


@pytest.mark.slow
def test_concurrent_claimers_share_no_row_and_miss_none(
    db_url: str, buffer_name: str, tmp_path: Path
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(make_rows(2_000))
        stored = {r.id for r in buffer.query()}
    outs = [tmp_path / f"learner{i}.jsonl" for i in range(4)]
    procs = [
        start(db_url, buffer_name, f"learner-{i}", 25, 0.01, out) for i, out in enumerate(outs)
    ]
    assert [p.wait(timeout=300) for p in procs] == [0] * 4
    taken = [
        [row_id for line in out.read_text().splitlines() for row_id in json.loads(line)]
        if out.exists()
        else []
        for out in outs
    ]
    every = [row_id for ids in taken for row_id in ids]
    assert len(every) == len(set(every)) == 2_000
    assert set(every) == stored
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        stats = buffer.queue_stats()
        assert stats.consumed == 2_000
        for i, ids in enumerate(taken):
            consumer = f"learner-{i}"
            assert stats.per_consumer.get(consumer, {"consumed": 0})["consumed"] == len(ids)
            if ids:
                assert buffer.checkpoint(consumer)["acked"] == len(ids)


@pytest.mark.slow
def test_learners_killed_at_random_resume_from_their_checkpoints_losing_nothing(
    db_url: str, buffer_name: str
) -> None:
    rows = 250 * KILLS  # more than two learners consume while every kill is made
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(make_rows(rows))
    rng = random.Random(KILLS)
    consumers = ["learner-0", "learner-1"]
    procs = {c: start(db_url, buffer_name, c, 7, 0.05) for c in consumers}
    kills = 0
    while kills < KILLS:
        time.sleep(rng.uniform(0.3, 1.2))  # imports take part of it: kills land anywhere
        victim = rng.choice(consumers)
        assert procs[victim].poll() is None, "the queue ran dry before every kill was made"
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait()
        kills += 1
        procs[victim] = start(db_url, buffer_name, victim, 7, 0.05)
    assert [p.wait(timeout=300) for p in procs.values()] == [0, 0]
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        stats = buffer.queue_stats()
        assert (stats.total, stats.consumed, stats.leased, stats.expired) == (rows, rows, 0, 0)
        lineage = buffer.lineage([r.id for r in buffer.query()])
        assert {record.state for record in lineage.values()} == {"consumed"}
        acked = 0
        for consumer in consumers:
            consumed = stats.per_consumer.get(consumer, {"consumed": 0})["consumed"]
            # The checkpoint was stored in the ack's own transaction: it counts exactly the
            # rows this consumer's acks consumed, however many times it was killed.
            assert buffer.checkpoint(consumer, default={"acked": 0})["acked"] == consumed
            acked += consumed
        assert acked == rows
