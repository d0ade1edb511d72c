"""Benchmark: the actors' side of asynchronous RL (issue: durable actors).

Two measurements per backend:

1. **Overhead per prompt.** ``--actors`` processes at once each take prompts from a
   prompt queue (``store_prompts(group_size=8)``) and, per prompt, time ``claim(1)`` +
   ``save_progress`` (the 8 partial completions, 256 tokens each, with their segments'
   versions) + ``ack(produce={prompt: 8 completions of 512 int32 tokens}, into=rollouts)``,
   with no generation in between (the store's own cost). Run twice: without an admission
   bound, and with one (``set_admission``: every claim then counts and takes under the
   bound's row lock; the bound is set loose enough never to hold anyone back). A learner
   process consumes the rollouts meanwhile. On Postgres a watcher samples
   ``pg_stat_activity`` every 5 ms for backends waiting on a lock: whether claimers queue
   behind each other (a convoy).
2. **Resume.** ``--actors`` processes generate prompts' completions (512 tokens in
   segments of 64, ``--segment-ms`` per segment), saving progress after each segment.
   After ``--run-s`` seconds every actor is SIGKILLed at once; the tokens saved in the
   database are counted; the actors are started again (new processes, taking their
   predecessors' claims over); reported: the time from the kill until generation runs
   again (the first segment saved after it), and how many of the saved tokens the new
   actors continued from (every one is the target).

Usage::

    python benchmarks/bench_actors.py                       # both backends
    python benchmarks/bench_actors.py --backends sqlite --prompts 100
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import LockWatch
from sqlalchemy import create_engine, select, text

from expstore import (
    AdmissionTimeoutError,
    DataRow,
    Experience,
    ExpMeta,
    ReplayBuffer,
    WaitTimeoutError,
)
from expstore.db.schema import progress

PG = "postgresql+psycopg://postgres@127.0.0.1:5432"
G = 8
TOKENS = 512
SEGMENT = 64


def _prompts(n: int, tag: str) -> list[DataRow]:
    return [
        DataRow(
            id=f"{tag}{i}",
            exp_meta=ExpMeta(task_id=f"{tag}{i}", agent_id="dataset", step=0),
            exp_data=Experience(state={"question": f"question {i}"}),
        )
        for i in range(n)
    ]


def _completions(pid: str, tokens: list[list[int]], versions: list[int]) -> list[DataRow]:
    return [
        DataRow(
            id=f"{pid}/c{c}",
            exp_meta=ExpMeta(
                task_id=pid,
                agent_id="actor",
                step=c,
                oldest_version=min(versions),
                newest_version=max(versions),
            ),
            exp_data=Experience(
                state={"tokens": np.asarray(made, dtype=np.int32)}, reward_t=float(c % 2)
            ),
        )
        for c, made in enumerate(tokens)
    ]


# -- 1. overhead per prompt --------------------------------------------------------------
def overhead_actor(url: str, name: str, index: int, out: Any) -> None:
    rng = np.random.default_rng(index)
    times: list[float] = []
    with (
        ReplayBuffer(url, name=f"{name}_prompts") as prompts,
        ReplayBuffer(url, name=f"{name}_rollouts") as rollouts,
    ):
        me = prompts.consumer(f"actor-{index}")
        while True:
            t0 = time.perf_counter()
            claim = me.claim(1)
            if not claim.ids:
                break
            pid = claim.ids[0]
            half = rng.integers(0, 50_000, (G, TOKENS // 2)).tolist()
            claim.save_progress({"tokens": half, "versions": [0, 0, 0, 0]})
            full = [h + h for h in half]
            claim.ack(produce={pid: _completions(pid, full, [0, 1])}, into=rollouts)
            times.append(time.perf_counter() - t0)
    out.put(times)


def overhead_learner(url: str, name: str, stop: Any) -> None:
    with ReplayBuffer(url, name=f"{name}_rollouts") as rollouts:
        while not stop.is_set():
            claim = rollouts.claim(64, consumer="learner")
            if len(claim):
                claim.ack()
            else:
                time.sleep(0.01)


def overhead(url: str, name: str, args: argparse.Namespace, admission: bool) -> str:
    with (
        ReplayBuffer(url, name=f"{name}_prompts") as prompts,
        ReplayBuffer(url, name=f"{name}_rollouts") as rollouts,
    ):
        prompts.store_prompts(_prompts(args.prompts, "p"), group_size=G)
        if admission:  # counted on every claim, loose enough never to hold one back
            prompts.set_admission(rollouts, batch_size=args.prompts * G, max_batches_ahead=1)
    spawn = multiprocessing.get_context("spawn")
    out, stop = spawn.Queue(), spawn.Event()
    learner = spawn.Process(target=overhead_learner, args=(url, name, stop))
    learner.start()
    watch = LockWatch(url, spawn).start()
    actors = [
        spawn.Process(target=overhead_actor, args=(url, name, i, out)) for i in range(args.actors)
    ]
    t0 = time.perf_counter()
    for p in actors:
        p.start()
    times = [t for _ in actors for t in out.get()]
    for p in actors:
        p.join()
    wall = time.perf_counter() - t0
    note = watch.note("claimers and learner")
    stop.set()
    learner.join()
    ms = np.asarray(times) * 1000
    assert len(times) == args.prompts, len(times)
    return (
        f"  {'with' if admission else 'no'} admission: claim + save_progress + ack "
        f"(8 x 512 tokens) p50 {np.percentile(ms, 50):.1f} ms, p95 "
        f"{np.percentile(ms, 95):.1f} ms, max {ms.max():.0f} ms over {len(times)} prompts "
        f"by {args.actors} actors ({len(times) / wall:.0f} prompts/s){note}"
    )


# -- 2. resume after SIGKILL of every actor ------------------------------------------------
def resume_actor(url: str, name: str, index: int, segment_s: float, log: str) -> None:
    rng = np.random.default_rng(index)
    with (
        open(log, "a") as out,
        ReplayBuffer(url, name=f"{name}_prompts") as prompts,
        ReplayBuffer(url, name=f"{name}_rollouts") as rollouts,
    ):
        me = prompts.consumer(f"actor-{index}", takeover=True)
        while True:
            try:
                claim = me.claim(1, wait_s=1.0)
            except (WaitTimeoutError, AdmissionTimeoutError):
                continue
            pid = claim.ids[0]
            state = claim.progress.get(pid)
            if state is not None:
                kept = sum(map(len, state["tokens"]))
                out.write(json.dumps({"resumed": kept, "t": time.time()}) + "\n")
                out.flush()
            else:
                state = {"tokens": [[] for _ in range(G)], "versions": []}
            while len(state["tokens"][0]) < TOKENS:
                time.sleep(segment_s)
                for made in state["tokens"]:
                    made.extend(rng.integers(0, 50_000, SEGMENT).tolist())
                state["versions"].append(rollouts.policy_version() or 0)
                claim.save_progress(state)
                out.write(json.dumps({"saved": SEGMENT * G, "t": time.time()}) + "\n")
                out.flush()
            claim.ack(
                produce={pid: _completions(pid, state["tokens"], state["versions"])}, into=rollouts
            )


def saved_tokens(url: str, name: str) -> int:
    """Tokens in the progress saved on the prompts' claims now, read from the database."""
    with ReplayBuffer(url, name=f"{name}_prompts") as prompts:
        handle = prompts.sql.handle
        mine = select(progress.c.state).where(progress.c.buffer_id == handle.buffer_id)
        with handle.single() as conn:
            saved = [json.loads(state) for state in conn.execute(mine).scalars()]
    return sum(sum(map(len, s["tokens"])) for s in saved)


def resume(url: str, name: str, args: argparse.Namespace) -> str:
    with ReplayBuffer(url, name=f"{name}_prompts") as prompts:
        prompts.store_prompts(_prompts(args.prompts, "r"), group_size=G)
    spawn = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        logs = [str(Path(tmp) / f"a{i}.jsonl") for i in range(args.actors)]

        def start() -> list[Any]:
            procs = [
                spawn.Process(
                    target=resume_actor, args=(url, name, i, args.segment_ms / 1000, logs[i])
                )
                for i in range(args.actors)
            ]
            for p in procs:
                p.start()
            return procs

        procs = start()
        # Until every actor generates (its first segment saved), then --run-s more.
        deadline = time.time() + 120
        while time.time() < deadline and not all(
            Path(log).exists() and '"saved"' in Path(log).read_text() for log in logs
        ):
            time.sleep(0.1)
        time.sleep(args.run_s)
        for p in procs:
            p.kill()  # every actor at once, mid-generation
        for p in procs:
            p.join()
        killed_at = time.time()
        saved = saved_tokens(url, name)
        procs = start()
        deadline = time.time() + 60
        resumed: list[int] = []
        first_saved = None
        while time.time() < deadline:
            time.sleep(0.1)
            events = [
                json.loads(line)
                for log in map(Path, logs)
                if log.exists()
                for line in log.read_text().splitlines()
            ]
            after = [e for e in events if e["t"] > killed_at]
            resumed = [e["resumed"] for e in after if "resumed" in e]
            firsts = [e["t"] for e in after if "saved" in e]
            if firsts and first_saved is None:
                first_saved = min(firsts)
            if first_saved is not None and sum(resumed) >= saved:
                break
        for p in procs:
            p.kill()
            p.join()
    kept = sum(resumed)
    again = float("nan") if first_saved is None else first_saved - killed_at
    return (
        f"  resume: {args.actors} actors SIGKILLed at once, {args.run_s:g} s into "
        f"generating, holding {saved} saved tokens; generation running again "
        f"{again:.2f} s after the kill "
        f"(new processes: Python start, imports, consumer takeover); saved tokens continued "
        f"from: {kept} of {saved} ({kept / max(saved, 1):.0%})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--actors", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=400)
    parser.add_argument("--segment-ms", type=float, default=50.0)
    parser.add_argument("--run-s", type=float, default=4.0)
    parser.add_argument(
        "--pg-database", default="bench_actors", help="made anew, then dropped (Postgres)"
    )
    args = parser.parse_args()
    db = args.pg_database
    for backend in args.backends.split(","):
        print(f"{backend}:", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            if backend == "sqlite":
                url = f"sqlite:///{Path(tmp) / 'actors.db'}"
            else:
                admin = create_engine(f"{PG}/postgres", isolation_level="AUTOCOMMIT")
                with admin.connect() as conn:
                    conn.execute(text(f'DROP DATABASE IF EXISTS "{db}"'))
                    conn.execute(text(f'CREATE DATABASE "{db}"'))
                url = f"{PG}/{db}"
            try:
                print(overhead(url, "plain", args, admission=False), flush=True)
                print(overhead(url, "admitted", args, admission=True), flush=True)
                print(resume(url, "resume", args), flush=True)
            finally:
                if backend != "sqlite":
                    with admin.connect() as conn:
                        conn.execute(text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
                    admin.dispose()


if __name__ == "__main__":
    main()
