"""Benchmark: claims (a consume-once queue) against sampling, alone and under concurrency.

For each backend, over a buffer of ``--rows`` small rows (metadata, a 16-float observation
and a reward), half of them already consumed (as a queue that has run a while is), it
prints:

1. ``claim(256) + ack`` against ``sample(256)`` with the same NumpyConverter (medians of
   ``--repeat`` calls; target: claim + ack <= 2x the sample), and the first claim after
   opening (its FIFO floor is not known yet, so it walks the consumed half once);
2. throughput of 1, 2 and 4 claimer processes each looping claim(256) + ack for
   ``--seconds``, in rows per second, with how often a claimer was seen waiting on a lock
   (Postgres: ``pg_stat_activity.wait_event_type = 'Lock'``, sampled every 5 ms);
3. end to end: 4 writer processes storing 64-row batches and 2 learners claiming 256 and
   acking, rows per second from the first write until every row is consumed.

Usage::

    python benchmarks/bench_claims.py                        # 1M rows, both backends
    python benchmarks/bench_claims.py --rows 100000 --backends sqlite
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from _common import LockWatch, ms
from sqlalchemy import create_engine, text

from expstore import DataRow, Experience, ExpMeta, NumpyConverter, ReplayBuffer, UniformSampler

CONVERTER = {"obs": "exp_data.state.obs", "reward": "exp_data.reward_t"}
BATCH = 256


def make(n: int, start: int, rng: np.random.Generator) -> list[DataRow]:
    obs = rng.standard_normal((n, 16)).astype(np.float32)
    return [
        DataRow(
            exp_meta=ExpMeta(
                task_id=f"t{(start + i) // 8}", agent_id=f"a{(start + i) % 4}", step=(start + i) % 8
            ),
            exp_data=Experience(state={"obs": obs[i]}, reward_t=float((start + i) % 5)),
        )
        for i in range(n)
    ]


def build(url: str, name: str, rows: int) -> None:
    """``rows`` rows, the older half marked consumed in bulk (as if acked long ago)."""
    rng = np.random.default_rng(0)
    with ReplayBuffer(url, name=name) as buffer:
        for start in range(0, rows, 50_000):
            buffer.store_batch(make(min(50_000, rows - start), start, rng))
        buffer_id = buffer.storage.buffer_id  # type: ignore[attr-defined]
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO expstore_consumption (key, buffer_id, claim_id, consumer, "
                "claimed_at, acked_at, times_claimed) SELECT key, buffer_id, 'old', 'old', "
                "0, 0, 1 FROM expstore_rows WHERE buffer_id = :b ORDER BY key LIMIT :n"
            ),
            {"b": buffer_id, "n": rows // 2},
        )
        if engine.dialect.name == "postgresql":
            conn.execute(text("ANALYZE expstore_consumption"))
            conn.execute(text("ANALYZE expstore_rows"))
    engine.dispose()


def one_claimer(url: str, name: str, repeat: int) -> None:
    converter = NumpyConverter(CONVERTER)
    with ReplayBuffer(url, name=name) as buffer:
        started = time.perf_counter()
        buffer.claim(BATCH, consumer="bench", converter=converter).ack()
        first = time.perf_counter() - started
        sampler = UniformSampler(seed=0)
        buffer.sample(sampler, converter=converter, batch_size=BATCH)  # builds the key index
        claims, samples = [], []
        for i in range(repeat):
            step = {"step": i}
            t0 = time.perf_counter()
            claim = buffer.claim(BATCH, consumer="bench", converter=converter)
            claim.ack(checkpoint=step)
            t1 = time.perf_counter()
            buffer.sample(sampler, converter=converter, batch_size=BATCH)
            t2 = time.perf_counter()
            claims.append(t1 - t0)
            samples.append(t2 - t1)
            assert len(claim) == BATCH
    c, s = ms(claims), ms(samples)
    print(f"  first claim(256) + ack after opening          {first * 1000:9.2f} ms")
    print(f"  claim(256) + ack, with a checkpoint           {c:9.2f} ms")
    print(f"  sample(256), UniformSampler                   {s:9.2f} ms")
    print(f"  ratio claim + ack / sample: {c / s:.2f}x (target <= 2x)")


def claimer(url: str, name: str, consumer: str, seconds: float, done: Any) -> None:
    converter = NumpyConverter(CONVERTER)
    rows = 0
    with ReplayBuffer(url, name=name) as buffer:
        buffer.claim(1, consumer=consumer).ack()  # connect and find the FIFO floor first
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            claim = buffer.claim(BATCH, consumer=consumer, converter=converter)
            if len(claim) < BATCH:
                done.put(-1)  # the queue ran dry: the figure would be wrong
                return
            claim.ack(checkpoint={"rows": rows})
            rows += len(claim)
    done.put(rows)


def reset_claims(url: str, name: str) -> None:
    """Make the rows the claimers of the last phase consumed claimable again."""
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "DELETE FROM expstore_consumption WHERE consumer <> 'old' AND buffer_id = "
                "(SELECT id FROM expstore_buffers WHERE name = :name)"
            ),
            {"name": name},
        )
    engine.dispose()


def concurrent(url: str, name: str, processes: int, seconds: float) -> None:
    reset_claims(url, name)
    spawn = multiprocessing.get_context("spawn")
    done = spawn.Queue()
    watch = LockWatch(url, spawn).start()
    procs = [
        spawn.Process(target=claimer, args=(url, name, f"c{p}", seconds, done))
        for p in range(processes)
    ]
    for p in procs:
        p.start()
    counts = [done.get() for _ in procs]
    for p in procs:
        p.join()
    note = watch.note("a claimer")
    if -1 in counts:
        raise SystemExit("the queue ran dry: build a larger buffer (--rows) or lower --seconds")
    total = sum(counts)
    print(f"  {processes} claimer(s): {total / seconds:10,.0f} rows/s{note}")


def writer(url: str, name: str, worker: int, rows: int) -> None:
    rng = np.random.default_rng(worker)
    with ReplayBuffer(url, name=name) as buffer:
        for start in range(0, rows, 64):
            buffer.store_batch(make(min(64, rows - start), worker * rows + start, rng))


def learner(url: str, name: str, consumer: str, expected: int) -> None:
    converter = NumpyConverter(CONVERTER)
    with ReplayBuffer(url, name=name) as buffer:
        while True:
            claim = buffer.claim(BATCH, consumer=consumer, converter=converter)
            if len(claim):
                claim.ack(checkpoint={"rows": len(claim)})
            elif buffer.queue_stats().consumed >= expected:
                return
            else:
                time.sleep(0.005)


def end_to_end(url: str, rows_per_writer: int) -> None:
    name = f"bench_e2e_{uuid.uuid4().hex[:8]}"
    with ReplayBuffer(url, name=name):
        pass
    spawn = multiprocessing.get_context("spawn")
    expected = 4 * rows_per_writer
    started = time.perf_counter()
    procs = [spawn.Process(target=writer, args=(url, name, w, rows_per_writer)) for w in range(4)]
    procs += [spawn.Process(target=learner, args=(url, name, f"l{i}", expected)) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    seconds = time.perf_counter() - started
    with ReplayBuffer(url, name=name) as buffer:
        stats = buffer.queue_stats()
    assert stats.consumed == expected == stats.total, stats
    print(
        f"  4 writers -> 2 learners: {expected:,} rows stored and consumed exactly once in "
        f"{seconds:.1f} s: {expected / seconds:,.0f} rows/s end to end"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=60)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--e2e-rows", type=int, default=10_000, help="rows per writer")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--scratch", help="folder for the SQLite file (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.scratch) as tmp:
        for backend in args.backends.split(","):
            url = f"sqlite:///{Path(tmp) / 'claims.db'}" if backend == "sqlite" else args.pg_url
            name = f"bench_claims_{uuid.uuid4().hex[:8]}"
            print(f"== {backend}: {args.rows:,} rows, half of them consumed ==", flush=True)
            started = time.perf_counter()
            build(url, name, args.rows)
            print(f"  (built in {time.perf_counter() - started:.0f} s)", flush=True)
            one_claimer(url, name, args.repeat)
            for processes in (1, 2, 4):
                concurrent(url, name, processes, args.seconds)
            end_to_end(url, args.e2e_rows)
            if backend != "sqlite":
                with ReplayBuffer(url, name=name) as buffer:
                    buffer.clear()


if __name__ == "__main__":
    main()
