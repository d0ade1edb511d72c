"""Benchmark: exporting 1M steps as a Minari dataset (``export_minari``, streamed) beside
Minari's own ``create_dataset_from_buffers`` on the same episodes (issue 46).

The data: 2,000 CartPole-shaped episodes of 500 steps (observation float32 [4], a
Discrete(2) action, reward 1, truncated at the last step), generated from one seed. The
buffer is built once (``--data``, a SQLite file; default under /work/scratch, never in
CI) and kept. Each measurement runs in a process of its own and reports its seconds and
its peak RSS above what the process held before the call (``ru_maxrss``): for
``export_minari`` the buffer is read from the database a chunk at a time; for Minari's
function the episodes must be in memory first (built from the same seed, counted in its
peak). Both write Minari's ``arrow`` format.

    python benchmarks/bench_minari.py [--steps 1000000] [--data PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

EPISODE = 500


def episode(e: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(e)
    return {
        "observations": rng.standard_normal((EPISODE + 1, 4)).astype(np.float32),
        "actions": rng.integers(0, 2, EPISODE),
        "rewards": np.ones(EPISODE),
        "terminations": np.zeros(EPISODE, bool),
        "truncations": np.r_[np.zeros(EPISODE - 1, bool), True],
    }


def build(path: Path, steps: int) -> None:
    """The buffer: one row per step at export_minari's paths, spaces recorded."""
    import gymnasium as gym
    from minari.serialization import serialize_space

    from expstore import ReplayBuffer

    spaces = {
        "observation_space": serialize_space(gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)),
        "action_space": serialize_space(gym.spaces.Discrete(2)),
    }
    with ReplayBuffer(f"sqlite:///{path}", name="minari") as buffer:
        start = time.perf_counter()
        for e in range(steps // EPISODE):
            ep = episode(e)
            info = [{"truncated": bool(t)} for t in ep["truncations"]]
            info[0]["minari"] = spaces
            buffer.extend(
                {
                    "task_id": f"episode-{e:05d}",
                    "agent_id": "bench",
                    "step": list(range(EPISODE)),
                    "state": {"observation": ep["observations"][:-1]},
                    "next_state": {"observation": ep["observations"][1:]},
                    "actions": [[int(a)] for a in ep["actions"]],
                    "reward_t": ep["rewards"],
                    "done": ep["terminations"],
                    "ext_info": info,
                }
            )
        print(f"built {buffer.count()} rows in {time.perf_counter() - start:.0f} s", flush=True)


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _frameworks() -> None:
    """Minari, pyarrow and Gymnasium imported before the measurement starts (their
    modules are not what is measured)."""
    import gymnasium  # noqa: F401
    import minari  # noqa: F401
    import pyarrow.dataset  # noqa: F401
    from minari.dataset._storages import arrow_storage  # noqa: F401


def run_export(data: str, root: str) -> dict[str, float]:
    from expstore import ReplayBuffer, export_minari

    _frameworks()

    os.environ["MINARI_DATASETS_PATH"] = root
    with ReplayBuffer(f"sqlite:///{data}", name="minari") as buffer:
        buffer.count()
        before = rss_mb()
        start = time.perf_counter()
        dataset = export_minari(buffer, "bench/expstore-v0", overwrite=True)
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "peak_mb": rss_mb() - before, "steps": dataset.total_steps}


def run_minari(steps_text: str, root: str) -> dict[str, float]:
    steps = int(steps_text)
    import gymnasium as gym
    import minari
    from minari.data_collector import EpisodeBuffer

    _frameworks()
    os.environ["MINARI_DATASETS_PATH"] = root
    before = rss_mb()
    start = time.perf_counter()
    buffers = [EpisodeBuffer(id=e, **episode(e)) for e in range(steps // EPISODE)]
    made = time.perf_counter()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset = minari.create_dataset_from_buffers(
            "bench/minari-v0",
            buffers,
            observation_space=gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
            action_space=gym.spaces.Discrete(2),
            data_format="arrow",
            jpeg_encoding=False,
        )
    seconds = time.perf_counter() - made
    return {
        "seconds": seconds,
        "build_seconds": made - start,
        "peak_mb": rss_mb() - before,
        "steps": dataset.total_steps,
    }


def in_process(what: str, *args: str) -> dict[str, float]:
    here = str(Path(__file__).parent)
    code = (
        f"import json, sys; sys.path.insert(0, {here!r}); import bench_minari as b; "
        f"print(json.dumps(b.{what}(*{args!r})))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(done.stderr)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--data", default=None, help="the buffer's SQLite file (built if absent)")
    args = parser.parse_args()
    data = Path(args.data or f"/work/scratch/minari_bench_{args.steps}.db")
    if not data.exists():
        data.parent.mkdir(parents=True, exist_ok=True)
        build(data, args.steps)
    with tempfile.TemporaryDirectory() as root:
        ours = in_process("run_export", str(data), root)
        theirs = in_process("run_minari", str(args.steps), root)
    print(f"Minari export of {args.steps} steps ({args.steps // EPISODE} episodes), arrow format")
    print(
        f"  export_minari (streamed from SQLite): {ours['seconds']:.1f} s, "
        f"{args.steps / ours['seconds']:,.0f} steps/s, peak RSS +{ours['peak_mb']:.0f} MB"
    )
    print(
        f"  minari.create_dataset_from_buffers:   {theirs['seconds']:.1f} s, "
        f"{args.steps / theirs['seconds']:,.0f} steps/s, peak RSS +{theirs['peak_mb']:.0f} MB "
        f"(episodes in memory, built in {theirs['build_seconds']:.1f} s)"
    )


if __name__ == "__main__":
    main()
