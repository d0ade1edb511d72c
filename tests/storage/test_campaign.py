"""The concurrency campaign in a bounded form: 8 writers, 2 samplers, a priority updater
and a set_retention loop at once; the buffer ends with exactly its capacity and the right
survivors under fifo, max_reward and task_fifo, on both backends."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

import pytest

from expstore import (
    EmptyBufferError,
    PrioritizedSampler,
    ReplayBuffer,
    StorageError,
    UniformSampler,
)
from tests.helpers import make_row

WRITERS, BATCHES, BATCH, CAPACITY = 8, 10, 40, 1_000


def _run(url: str, name: str, policy: str) -> dict[str, float]:
    """Run the campaign; returns each written row's reward by id."""
    with ReplayBuffer(url, name=name, capacity=CAPACITY, eviction=policy):
        pass
    written: dict[str, float] = {}
    errors: list[BaseException] = []
    writing = threading.Event()
    writing.set()
    lock = threading.Lock()
    rng = random.Random(0)
    rewards = rng.sample(range(10**6), WRITERS * BATCHES * BATCH)

    def guarded(body: Callable[[ReplayBuffer], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                with ReplayBuffer(url, name=name) as buffer:
                    body(buffer)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)

        return run

    def writer(w: int) -> Callable[[ReplayBuffer], None]:
        def body(buffer: ReplayBuffer) -> None:
            for b in range(BATCHES):
                start = (w * BATCHES + b) * BATCH
                rows = [
                    make_row(f"w{w}b{b}", f"w{w}", i, reward=float(rewards[start + i]))
                    for i in range(BATCH)
                ]
                buffer.store_batch(rows)
                with lock:
                    written.update((r.id, float(r.exp_data.reward_t or 0)) for r in rows)

        return body

    def sample(buffer: ReplayBuffer, sampler: Any, n: int) -> list[Any]:
        try:
            return buffer.sample(sampler, batch_size=n)  # type: ignore[no-any-return]
        except EmptyBufferError:
            return []
        except StorageError as exc:  # evictions outran a weighted sampler: it says retry
            assert "Retry the call" in str(exc)
            return []

    def sampler(buffer: ReplayBuffer) -> None:
        samplers = [UniformSampler(seed=1), PrioritizedSampler(seed=2)]
        while writing.is_set():
            for s in samplers:
                sample(buffer, s, 32)

    def updater(buffer: ReplayBuffer) -> None:
        per = PrioritizedSampler(seed=3)
        while writing.is_set():
            batch = sample(buffer, per, 16)
            buffer.update_priorities([r.id for r in batch], [1.0 + i for i in range(len(batch))])

    def retention(buffer: ReplayBuffer) -> None:
        while writing.is_set():
            buffer.set_retention(CAPACITY, policy)

    writers = [threading.Thread(target=guarded(writer(w))) for w in range(WRITERS)]
    others = [threading.Thread(target=guarded(b)) for b in (sampler, sampler, updater, retention)]
    for t in writers + others:
        t.start()
    for t in writers:
        t.join()
    writing.clear()
    for t in others:
        t.join()
    assert not errors, errors
    return written


@pytest.mark.parametrize("policy", ["fifo", "max_reward", "task_fifo"])
def test_capacity_and_survivors_hold_under_everything_at_once(
    db_url: str, buffer_name: str, policy: str
) -> None:
    written = _run(db_url, buffer_name, policy)
    assert len(written) == WRITERS * BATCHES * BATCH
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        rows = list(buffer.query())
        keys = buffer.storage.key_index()["key"].tolist()
    assert len(rows) == CAPACITY
    assert {r.id for r in rows} <= set(written)
    if policy == "fifo":  # the newest rows: writers took turns, so keys are consecutive
        assert keys == list(range(keys[-1] - CAPACITY + 1, keys[-1] + 1))
    elif policy == "max_reward":  # the highest rewards ever written
        best = sorted(written.values(), reverse=True)[:CAPACITY]
        assert sorted((r.exp_data.reward_t for r in rows), reverse=True) == best
    else:  # whole tasks, the most recently written ones
        tasks: dict[str, int] = {}
        for r in rows:
            tasks[r.exp_meta.task_id] = tasks.get(r.exp_meta.task_id, 0) + 1
        assert set(tasks.values()) == {BATCH} and len(tasks) == CAPACITY // BATCH
        assert keys == list(range(keys[-1] - CAPACITY + 1, keys[-1] + 1))
