"""WebGym-style web-agent trajectories to a LLaMA-Factory SFT dataset.

Each step of a trajectory stores the screenshot itself (a uint8 HxWx3 array: stored once
per distinct page and compressed, however many steps show it), the chat messages the
policy saw and the action it answered. For fine-tuning we keep, as WebGym's replay buffer
does:

- steps of successful trajectories (final reward 1), and
- steps whose screenshot differs from the next step's (the action changed the page:
  ``changed(exp_data.state.screenshot, next)``, compared by the database, as WebGym's
  ``filter_same_screenshot=True``),

sample them with a recency bias (WebGym's ``recency_bias_power``) and write them in
LLaMA-Factory's sharegpt "messages" layout, with the screenshots as PNG ``images``
(Pillow, ``pip install 'expstore[images]'``).

    python examples/web_agent_sft.py --out sft_data
    llamafactory-cli train ... --dataset_dir sft_data --dataset webgym_sft
"""

from __future__ import annotations

import argparse
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
#: Screenshot size (height, width): a small browser window, to keep the example quick.
SCREEN = (180, 320)


def screenshot(task_index: int, page: int) -> np.ndarray:
    """A page-like screenshot: a white page, a header bar, lines of "text" that depend on
    the page shown."""
    rng = np.random.default_rng(task_index * 1000 + page)
    image = np.full((*SCREEN, 3), 255, np.uint8)
    image[:24] = (40 + 50 * task_index, 90, 160)  # the site's header
    for line in range(int(rng.integers(4, 9))):
        top = 36 + line * 16
        width = int(rng.integers(80, SCREEN[1] - 20))
        image[top : top + 8, 12 : 12 + width] = rng.integers(0, 90, (8, width, 1), np.uint8)
    return image


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
        action = ACTIONS[int(rng.integers(len(ACTIONS) - 1))] if step < n_steps - 1 else "stop"
        rows.append(
            DataRow(
                exp_meta=ExpMeta(task_id=task_id, task_name=site, agent_id="webagent", step=step),
                exp_data=Experience(
                    state={
                        "url": f"https://{site}/p{pages[step]}",
                        "screenshot": screenshot(task_index, pages[step]),
                    },
                    messages=[
                        {"role": "system", "content": SYSTEM},
                        {"role": "user", "content": f"<image>Task: {goal}\nStep {step + 1}"},
                    ],
                    actions=[{"action_string": action}],
                    reward_t=(1.0 if success else 0.0) if step == n_steps - 1 else 0.0,
                    done=step == n_steps - 1,
                    ext_info={"trajectory_reward": 1.0 if success else 0.0},
                ),
            )
        )
    # The last step's action leads to one more page, never stored: the next trajectory's
    # first step is another task. Its screenshot is what "changed(..., next)" cannot see,
    # so the last step counts as changed (kept).
    return rows


class SftConverter(ChatConverter):
    """ChatConverter's messages records plus the step's screenshot, written as a PNG file
    in ``folder`` (named by its digest: a page shown by many steps is written once)."""

    def __init__(self, folder: Path, **options: Any) -> None:
        super().__init__(**options)
        self.folder = folder

    def to_dataset_row(self, rows: Sequence[DataRow]) -> list[dict[str, Any]]:
        from PIL import Image

        from expstore.codec.digests import array_digest

        records = super().to_dataset_row(rows)
        (self.folder / "screenshots").mkdir(parents=True, exist_ok=True)
        for record, row in zip(records, rows, strict=True):
            image = row.exp_data.state["screenshot"]
            name = f"screenshots/{array_digest(image)}.png"
            if not (self.folder / name).exists():
                Image.fromarray(image).save(self.folder / name)
            record["images"] = [name]
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
        .changed("exp_data.state.screenshot", "next")  # the action changed the page
        .build()
    )
    arrays, pixels, stored = buffer.array_stats()
    print(
        f"{len(buffer)} steps in {len(buffer.task_ids())} trajectories; "
        f"{buffer.count(trainable)} trainable where {trainable}"
    )
    print(
        f"screenshots: {len(buffer)} steps show {arrays} distinct pages, "
        f"{pixels / 1e6:.1f} MB of pixels stored in {stored / 1e6:.2f} MB"
    )

    out = Path(args.out or tempfile.mkdtemp(prefix="web_agent_sft_"))
    out.mkdir(parents=True, exist_ok=True)
    records = buffer.sample(
        RecencySampler(power=2.0, seed=0),  # newer trajectories more likely, no repeats
        trainable,
        SftConverter(out, format="messages"),
        batch_size=args.samples,
    )
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
