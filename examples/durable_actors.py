"""Actors that lose nothing: a prompt queue, exactly-once generation, partial rollouts that
survive SIGKILL, and admission by staleness, with actors killed at random all along.

Prompts are rows of a ``prompts`` buffer, each with a target of ``G`` completions. Actor
processes claim a prompt, generate its ``G`` completions a segment of tokens at a time
(a weight update may land between segments: each segment records the policy version it
was made with), save their progress on the claim after every segment, and commit the
completions into the ``rollouts`` buffer together with the prompt's ack. A learner
claims whole groups, trains, and publishes a new policy version each step. Actors never
run further ahead of it than ``(max_staleness + 1) * batch`` completions (admission, in
the database). Meanwhile this script SIGKILLs a random actor every so often and starts
it again: the new incarnation takes over its predecessor's claim at once and continues
from the saved tokens.

At the end it checks that every prompt has exactly ``G`` completions, each token for
token what an uninterrupted actor would have made, the learner consumed each once, and
reports how many generated tokens were kept (every saved one must be).

    python examples/durable_actors.py                    # a SQLite file in a temp dir
    python examples/durable_actors.py --db postgresql+psycopg://postgres@127.0.0.1/postgres
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from expstore import (
    AdmissionTimeoutError,
    DataRow,
    Experience,
    ExpMeta,
    GroupSampler,
    ReplayBuffer,
    WaitTimeoutError,
)


def token(prompt: str, completion: int, position: int) -> int:
    """The token an actor makes: fixed by its place, so a resumed rollout can be checked."""
    return (sum(map(ord, prompt)) * 7919 + completion * 104729 + position * 13) % 50_000


def actor(url: str, index: int, args: argparse.Namespace, log: str) -> None:
    """Claim prompts, generate their completions segment by segment, commit them with the
    prompt's ack; resume from saved progress after a kill."""
    out = Path(log).open("a")

    def note(**event: Any) -> None:
        out.write(json.dumps({"t": time.time(), "actor": index, **event}) + "\n")
        out.flush()

    with (
        ReplayBuffer(url, name=f"{args.name}_prompts") as prompts,
        ReplayBuffer(url, name=f"{args.name}_rollouts") as rollouts,
    ):
        me = prompts.consumer(f"actor-{index}", takeover=True)  # fences out the killed one
        note(event="start", taken_back=me.taken_back)
        while True:
            try:
                claim = me.claim(1, lease_s=args.lease, wait_s=1.0)
            except (AdmissionTimeoutError, WaitTimeoutError):
                if prompts.queue_stats().completions.done == args.prompts:  # type: ignore[union-attr]
                    return
                continue
            if not claim.ids:
                continue
            pid = claim.ids[0]
            need = claim.needs[pid]
            state = claim.progress.get(pid) or {"tokens": [[] for _ in range(need)], "versions": []}
            if state["versions"]:
                note(event="resumed", tokens=sum(map(len, state["tokens"])))
            first = args.group_size - need  # completions stored already by an earlier ack
            while len(state["tokens"][0]) < args.tokens:
                version = rollouts.policy_version() or 0  # the weights loaded now
                time.sleep(args.segment_s)  # generating one segment of every completion
                for c, made in enumerate(state["tokens"]):
                    at = len(made)
                    made.extend(token(pid, first + c, at + j) for j in range(args.segment))
                    del made[args.tokens :]
                state["versions"].append(version)
                note(event="generated", tokens=args.segment * len(state["tokens"]))
                claim.save_progress(state)  # one statement; survives a kill from here
                note(event="saved")
            versions = state["versions"]
            made_rows = [
                DataRow(
                    id=f"{pid}/c{first + c}",
                    exp_meta=ExpMeta(
                        task_id=pid,
                        agent_id=f"actor-{index}",
                        step=first + c,
                        oldest_version=min(versions),
                        newest_version=max(versions),
                    ),
                    exp_data=Experience(
                        state={"prompt": pid, "tokens": np.asarray(tokens, dtype=np.int32)},
                        reward_t=float(tokens[-1] % 2),
                    ),
                )
                for c, tokens in enumerate(state["tokens"])
            ]
            claim.ack(produce={pid: made_rows}, into=rollouts)
            note(event="acked", prompt=pid)


def learn(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Claim whole groups, train, publish a version per step, until every group is done."""
    total = args.prompts * args.group_size
    sampler = GroupSampler("task_id", args.group_size)
    staleness: list[int] = []
    with ReplayBuffer(url, name=f"{args.name}_rollouts") as rollouts:
        learner = rollouts.consumer("learner")
        step = learner.checkpoint(default={"step": 0})["step"]
        consumed = rollouts.queue_stats().consumed
        while consumed < total:
            try:
                claim = learner.claim(
                    args.batch * args.group_size,
                    order=sampler,
                    wait_s=2.0,
                    min_batch_size=args.batch * args.group_size,  # a full batch: one version each
                )
            except WaitTimeoutError:
                continue
            version = rollouts.policy_version() or 0
            staleness += [version - r.exp_meta.policy_version for r in claim.batch]
            time.sleep(args.train_s)  # a training step
            with learner.step() as st:
                st.ack(claim)
                st.save_checkpoint({"step": step + 1})
                st.set_policy_version(step + 1)
            step += 1
            consumed += len(claim)
    return {"steps": step, "staleness": staleness}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="database URL (default: a SQLite file in a temp dir)")
    parser.add_argument("--name", default="actors", help="buffers <name>_prompts, _rollouts")
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=48, help="tokens per completion")
    parser.add_argument("--segment", type=int, default=8, help="tokens per segment")
    parser.add_argument("--segment-s", type=float, default=0.03)
    parser.add_argument("--actors", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2, help="groups per training step")
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--train-s", type=float, default=0.05)
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--kill-every", type=float, default=1.5, help="seconds (0: never)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'actors.db'}"
        with (
            ReplayBuffer(url, name=f"{args.name}_prompts") as prompts,
            ReplayBuffer(url, name=f"{args.name}_rollouts") as rollouts,
        ):
            prompts.clear()
            rollouts.clear()
            rollouts.set_policy_version(0, force=True)
            made = [
                DataRow(
                    id=f"prompt{i}",
                    exp_meta=ExpMeta(task_id=f"prompt{i}", agent_id="dataset", step=0),
                    exp_data=Experience(state={"question": f"q{i}"}),
                )
                for i in range(args.prompts)
            ]
            prompts.store_prompts(made, group_size=args.group_size)
            prompts.set_admission(
                rollouts,
                batch_size=args.batch * args.group_size,
                max_batches_ahead=args.max_staleness,
                timeout_s=None,
            )
        ctx = multiprocessing.get_context("spawn")
        logs = [str(Path(tmp) / f"actor{i}.jsonl") for i in range(args.actors)]

        def start(i: int) -> Any:
            p = ctx.Process(target=actor, args=(url, i, args, logs[i]), daemon=True)
            p.start()
            return p

        procs = [start(i) for i in range(args.actors)]
        kills: list[tuple[float, int]] = []
        learned: dict[str, Any] = {}
        learner = threading.Thread(target=lambda: learned.update(learn(url, args)))
        learner.start()
        next_kill = time.monotonic() + args.kill_every
        while learner.is_alive():
            learner.join(0.05)
            if args.kill_every and time.monotonic() >= next_kill and learner.is_alive():
                i = rng.randrange(args.actors)
                procs[i].kill()  # SIGKILL: no cleanup of any kind
                procs[i].join()
                kills.append((time.time(), i))
                procs[i] = start(i)
                next_kill = time.monotonic() + args.kill_every * (0.5 + rng.random())
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        events = [json.loads(line) for log in logs for line in Path(log).read_text().splitlines()]
        check(url, args, learned, kills, events)


def check(
    url: str,
    args: argparse.Namespace,
    learned: dict[str, Any],
    kills: list[tuple[float, int]],
    events: list[dict[str, Any]],
) -> None:
    """Every completion stored once and right, every group consumed once; the figures."""
    with (
        ReplayBuffer(url, name=f"{args.name}_prompts") as prompts,
        ReplayBuffer(url, name=f"{args.name}_rollouts") as rollouts,
    ):
        stored = list(rollouts.query())
        assert len(stored) == args.prompts * args.group_size, len(stored)
        for row in stored:
            pid, c = row.exp_meta.task_id, row.exp_meta.step
            want = [token(pid, c, j) for j in range(args.tokens)]
            assert row.exp_data.state["tokens"].tolist() == want, f"{row.id} differs"
        done = prompts.queue_stats().completions
        assert done is not None and done.done == args.prompts
        queue = rollouts.queue_stats()
        assert queue.consumed == len(stored), "a group was not consumed exactly once"
        made = rollouts.lineage([r.id for r in stored[:1]])[stored[0].id].produced_by
        assert made is not None and made.prompt_id == stored[0].exp_meta.task_id
    generated = sum(e["tokens"] for e in events if e["event"] == "generated")
    kept = args.prompts * args.group_size * args.tokens
    resumed = [e for e in events if e["event"] == "resumed"]
    up, again = [], []
    for at, i in kills:  # from a kill to the restarted actor: up, and generating again
        mine = [e for e in events if e["actor"] == i and e["t"] > at]
        started = [e["t"] for e in mine if e["event"] == "start"]
        if started:
            up.append(min(started) - at)
        first = next((e for e in mine if e["event"] in ("resumed", "acked")), None)
        if first is not None and first["event"] == "resumed":  # it continued a rollout
            again.append(first["t"] - at)
    spread = np.asarray(learned["staleness"])
    print(f"{args.prompts} prompts x {args.group_size} completions of {args.tokens} tokens")
    print(
        f"{len(kills)} actors SIGKILLed; {len(resumed)} rollouts resumed from saved progress; "
        f"learner: {learned['steps']} steps, every group consumed once"
    )
    print(
        f"tokens generated {generated}, kept {kept} ({kept / max(generated, 1):.1%}); "
        f"lost {generated - kept} (made after the last save before a kill)"
    )
    if up:
        print(
            f"a killed actor is back, its claims taken over, {np.median(up):.2f} s (median) "
            "after the kill (a new Python process)"
            + ("" if not again else f"; continuing a saved rollout {np.median(again):.2f} s")
        )
    print(
        f"staleness of trained rows (versions behind, oldest segment): "
        f"max {int(spread.max())}, mean {spread.mean():.2f}"
    )
    print("every completion stored once, token for token as made without kills")


if __name__ == "__main__":
    main()
