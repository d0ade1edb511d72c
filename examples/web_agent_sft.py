"""WebGym-style web-agent trajectories to a LLaMA-Factory SFT dataset.

Each step of a trajectory stores the screenshot path, the chat messages the policy saw and
the action it answered. For fine-tuning we keep, as WebGym's replay buffer does:

- steps of successful trajectories (final reward 1), and
- steps whose screenshot differs from the next step's (the action changed the page),

sample them with a recency bias (WebGym's ``recency_bias_power``) and write them in
LLaMA-Factory's sharegpt "messages" layout, with the screenshots as ``images``.

    python examples/web_agent_sft.py --out sft_data
    llamafactory-cli train ... --dataset_dir sft_data --dataset webgym_sft
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer
from expstore.converters import ChatConverter
from expstore.query import QueryBuilder
from expstore.samplers import RecencySampler

SYSTEM = "You are a web agent. Answer with one action: click [id], type [id] text, or stop."
TASKS = [
    ("Find the cheapest flight from Boston to Denver", "flights.example.com"),
    ("Add a blue T-shirt in size M to the cart", "shop.example.com"),
    ("Find the opening hours of the city library", "city.example.org"),
    ("Subscribe to the newsletter with ann@example.com", "news.example.com"),
]
ACTIONS = ["click [12]", "click [7]", "type [3] Denver", "scroll down", "click [31]", "stop"]


def play(task_index: int, attempt: int, rng: np.random.Generator) -> list[DataRow]:
    """One simulated trajectory, stored whole when it ends."""
    goal, site = TASKS[task_index]
    task_id = f"web-{task_index}-try{attempt}"
    n_steps = int(rng.integers(2, 6))
    success = bool(rng.random() < 0.6)
    # Page states: an action sometimes leaves the page as it was (same screenshot).
    pages = [0]
    for _ in range(n_steps):
        pages.append(pages[-1] + (0 if rng.random() < 0.3 else 1))
    rows = []
    for step in range(n_steps):
        shot = f"screenshots/{task_id}/page{pages[step]}.png"
        digest = hashlib.sha1(shot.encode()).hexdigest()[:12]
        changed = pages[step + 1] != pages[step]
        action = ACTIONS[int(rng.integers(len(ACTIONS) - 1))] if step < n_steps - 1 else "stop"
        rows.append(
            DataRow(
                exp_meta=ExpMeta(task_id=task_id, task_name=site, agent_id="webagent", step=step),
                exp_data=Experience(
                    state={
                        "url": f"https://{site}/p{pages[step]}",
                        "screenshot": shot,
                        "screenshot_hash": digest,
                    },
                    messages=[
                        {"role": "system", "content": SYSTEM},
                        {"role": "user", "content": f"<image>Task: {goal}\nStep {step + 1}"},
                    ],
                    actions=[{"action_string": action}],
                    reward_t=(1.0 if success else 0.0) if step == n_steps - 1 else 0.0,
                    done=step == n_steps - 1,
                    ext_info={
                        "trajectory_reward": 1.0 if success else 0.0,
                        "screenshot_changed": changed,
                    },
                ),
            )
        )
    return rows


class SftConverter(ChatConverter):
    """ChatConverter's messages records plus the step's screenshot as ``images``."""

    def to_dataset_row(self, rows: Sequence[DataRow]) -> list[dict[str, Any]]:
        records = super().to_dataset_row(rows)
        for record, row in zip(records, rows, strict=True):
            record["images"] = [row.exp_data.state["screenshot"]]
        return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=None, help="database URL (default: in memory)")
    parser.add_argument("--out", default=None, help="folder for sft.json (default: a temp dir)")
    parser.add_argument("--samples", type=int, default=16)
    args = parser.parse_args()

    buffer = ReplayBuffer(args.db, name="web_agent_sft")
    buffer.clear()
    rng = np.random.default_rng(0)
    for attempt in range(6):
        for task_index in range(len(TASKS)):
            buffer.store_batch(play(task_index, attempt, rng))

    trainable = (
        QueryBuilder()
        .eq("exp_data.ext_info.trajectory_reward", 1.0)
        .and_()
        .eq("exp_data.ext_info.screenshot_changed", True)
        .build()
    )
    print(
        f"{len(buffer)} steps in {len(buffer.task_ids())} trajectories; "
        f"{buffer.count(trainable)} trainable where {trainable}"
    )

    records = buffer.sample(
        RecencySampler(power=2.0, seed=0),  # newer trajectories more likely, no repeats
        trainable,
        SftConverter(format="messages"),
        batch_size=args.samples,
    )
    out = Path(args.out or tempfile.mkdtemp(prefix="web_agent_sft_"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "sft.json").write_text(json.dumps(records, indent=2, ensure_ascii=False))
    dataset_info = {
        "webgym_sft": {
            "file_name": "sft.json",
            "formatting": "sharegpt",
            "columns": {"messages": "messages", "images": "images"},
            "tags": {
                "role_tag": "role",
                "content_tag": "content",
                "user_tag": "user",
                "assistant_tag": "assistant",
                "system_tag": "system",
            },
        }
    }
    (out / "dataset_info.json").write_text(json.dumps(dataset_info, indent=2))
    print(f"wrote {len(records)} SFT records to {out / 'sft.json'} (+ dataset_info.json)")
    print(json.dumps(records[0], ensure_ascii=False))
    buffer.close()


if __name__ == "__main__":
    main()
