"""A writer killed with SIGKILL at random moments mid-store_batch: no batch is ever torn,
and no batch its writer saw committed is lost (a bounded form of the 100-kill campaign)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from expstore import ReplayBuffer
from tests.storage.crash_writer import BATCH

ROOT = Path(__file__).resolve().parents[2]
KILLS = int(os.environ.get("EXPSTORE_CRASH_KILLS", "6"))


def test_sigkill_mid_batch_leaves_whole_batches_and_loses_no_commit(
    db_url: str, buffer_name: str, tmp_path: Path
) -> None:
    with ReplayBuffer(db_url, name=buffer_name):
        pass  # schema and buffer exist before the first writer starts
    log = tmp_path / "committed.log"
    rng = random.Random(0)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for kill in range(KILLS):
        writer = subprocess.Popen(
            [sys.executable, "-m", "tests.storage.crash_writer", db_url, buffer_name, str(log),
             str(kill * 1_000_000)],
            cwd=ROOT,
            env=env,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while (not log.exists() or log.read_text().count("\n") <= kill) and writer.poll() is None:
            assert time.monotonic() < deadline, "the writer never committed a batch"
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.3))  # somewhere inside a later batch
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    committed = {int(line) for line in log.read_text().split()}
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        per_batch: dict[str, list[int]] = {}
        for row in buffer.query():
            per_batch.setdefault(row.exp_meta.task_id, []).append(row.exp_meta.step)
    assert all(sorted(steps) == list(range(BATCH)) for steps in per_batch.values())  # none torn
    stored = {int(task[1:]) for task in per_batch}
    assert committed <= stored  # every batch its writer saw committed survived
    assert len(stored - committed) <= KILLS  # at most the one in flight at each kill
