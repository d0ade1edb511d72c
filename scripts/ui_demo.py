"""The viewer's demo database, and the screenshots of docs/ui/ taken from it.

Builds ``agents.db`` (SQLite) in ``--folder`` with three buffers a new user of ``expstore
ui`` would bring:

- ``web``: 30 web-agent tasks of 720p page screenshots (drawn), each step with the page's
  URL, a click or typed text at a position on the page, a chat in OpenAI's shape (a system
  prompt repeated every step, the goal, ``<think>``, tool calls and their results), a
  shaping reward on the way and a final reward of 1 for half of the tasks; some actions do
  not change the page; one task is a hand-off between a planner and a browser agent.
- ``prompts`` and ``rollouts``: GRPO prompts with a target of 4 completions each, claimed
  by actors whose acks store the completions (linked to their prompt through lineage),
  the learner holding a claim on some of them.

With ``--screenshots DIR`` it then serves the viewer over that database (as
``sqlite:///agents.db``, relative, so no temporary path shows in the pictures) and takes
each page's screenshot in headless Chromium into ``DIR``::

    python scripts/ui_demo.py --folder /tmp/demo --screenshots docs/ui
    expstore ui /tmp/demo/agents.db          # or look at it yourself
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer

TASKS = 30
SYSTEM = (
    "You are a web agent. You see the page as a screenshot and act with the tools click(x, y), "
    "type(x, y, text) and read_page(). Think before you act; stop when the goal is reached."
)
GOALS = [
    "Buy the cheapest USB-C cable with at least 4 stars",
    "Find the opening hours of the city library on Saturday",
    "Book a table for two at an Italian restaurant tonight at 8",
    "Subscribe to the newsletter with the address ada@example.com",
    "Find the return policy for shoes bought online",
    "Add two bags of coffee beans to the cart and check out",
]
SITES = ["shop.example", "library.example", "tables.example", "news.example", "shoes.example"]


def page(task: int, step: int, button: tuple[int, int]) -> np.ndarray:
    """A 720p page: a header bar, a search box, cards, a highlighted button."""
    rng = np.random.default_rng(task * 100 + step)
    image = np.full((720, 1280, 3), 247, np.uint8)
    image[:64] = (36, 88, 179) if task % 2 == 0 else (30, 120, 90)
    image[20:44, 24:180] = 235
    image[96:140, 240:1040] = 255
    image[96:98, 240:1040] = image[138:140, 240:1040] = 200
    for card in range(4):
        x = 80 + card * 290
        shade = int(rng.integers(225, 245))
        image[200:460, x : x + 260] = shade
        image[220:340, x + 20 : x + 240] = rng.integers(120, 220, 3, dtype=np.uint8)
        image[360:374, x + 20 : x + 200 - 20 * card] = 90
        image[390:402, x + 20 : x + 140] = 150
    bx, by = button
    image[by - 20 : by + 20, bx - 70 : bx + 70] = (225, 110, 40)
    image[520 + 12 * (step % 8) : 532 + 12 * (step % 8), 80:1200] = 215
    return image


def web_rows(now: float) -> list[DataRow]:
    rows = []
    for t in range(TASKS):
        goal = GOALS[t % len(GOALS)]
        site = SITES[t % len(SITES)]
        n = 4 + (t * 7) % 6
        success = t % 2 == 0
        start = now - 3600 + t * 100
        version = t // 6
        history: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": goal},
        ]
        shot = None
        for s in range(n):
            button = (200 + 290 * (s % 4), 430)
            stuck = s in (2,) and t % 3 == 0  # the click did nothing: the same page again
            if not stuck or shot is None:
                shot = page(t, s, button)
            typing = s == 1
            x, y = (640, 118) if typing else button
            name = "type" if typing else "click"
            args: dict[str, Any] = {"x": x, "y": y}
            if typing:
                args["text"] = goal.split()[-1].lower()
            call_id = f"call_{t}_{s}"
            assistant: dict[str, Any] = {
                "role": "assistant",
                "content": (
                    f"<think>The page shows {site}. To reach the goal I should "
                    f"{'search first' if typing else 'open the next item'}; "
                    "the button is highlighted in orange.</think>"
                    + ("I will search for it." if typing else "Opening the item.")
                ),
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)},
                    }
                ],
            }
            tool = {
                "role": "tool",
                "tool_call_id": call_id,
                "content": "the page did not change" if stuck else f"ok: {site}/p/{s + 1}",
            }
            history = history + [assistant, tool]
            last = s == n - 1
            handoff = t == 3 and s == 1
            agent = "browser-agent" if not (t == 3 and s == 0) else "planner"
            reward = (1.0 if success else 0.0) if last else (0.1 if s % 2 == 1 else 0.0)
            rows.append(
                DataRow(
                    id=f"web-{t:02d}-{s}",
                    exp_meta=ExpMeta(
                        task_id=f"task-{t:02d}",
                        task_name=goal,
                        agent_id=agent,
                        pre_agent="planner" if handoff else None,
                        step=s,
                        execute_time=start + sum(2.5 + (k % 3) * 1.7 for k in range(s)),
                        policy_version=version,
                    ),
                    exp_data=Experience(
                        state={
                            "url": f"https://{site}/p/{s}",
                            "title": goal,
                            "screenshot": shot,
                        },
                        actions=[{"name": name, **args}],
                        reward_t=reward,
                        done=last,
                        messages=history,
                    ),
                )
            )
    return rows


def grpo(url: str) -> None:
    """Prompts with a target of 4 completions, claimed by two actors whose acks store the
    completions; the learner then claims some completions (a held claim on the page)."""
    questions = [
        f"What is {a} × {b}? Answer with the number only."
        for a, b in [(7, 8), (12, 11), (9, 9), (14, 3), (25, 4), (6, 13), (17, 2), (8, 15)]
    ]
    with (
        ReplayBuffer(url, name="prompts") as prompts,
        ReplayBuffer(url, name="rollouts") as rollouts,
    ):
        if len(prompts):
            return
        prompts.store_prompts(
            [
                DataRow(
                    id=f"prompt-{i}",
                    exp_meta=ExpMeta(task_id=f"prompt-{i}", agent_id="dataset", step=0),
                    exp_data=Experience(messages=[{"role": "user", "content": q}]),
                )
                for i, q in enumerate(questions)
            ],
            group_size=4,
        )
        rng = np.random.default_rng(0)
        for i, q in enumerate(questions):
            actor = prompts.consumer(f"actor-{i % 2}")
            claim = actor.claim(1)
            pid = claim.ids[0]
            a, b = (int(w) for w in q.split("?")[0].split()[-3:][::2])
            made = []
            for c in range(4):
                right = rng.random() < 0.3 + 0.08 * i
                answer = a * b if right else a * b + int(rng.integers(1, 9))
                made.append(
                    DataRow(
                        id=f"{pid}/c{c}",
                        exp_meta=ExpMeta(
                            task_id=pid, agent_id=f"actor-{i % 2}", step=c, policy_version=i // 3
                        ),
                        exp_data=Experience(
                            reward_t=float(right),
                            messages=[
                                {"role": "user", "content": q},
                                {
                                    "role": "assistant",
                                    "content": f"<think>{a} × {b}: {a} × {b // 2} = "
                                    f"{a * (b // 2)}, doubled, plus the rest.</think>{answer}",
                                },
                            ],
                        ),
                    )
                )
            claim.ack(produce={pid: made}, into=rollouts)
        rollouts.set_policy_version(3)
        rollouts.claim(8, consumer="learner-0")


def build(folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{folder / 'agents.db'}"
    with ReplayBuffer(url, name="web") as web:
        if not len(web):
            web.store_batch(web_rows(time.time()))
    grpo(url)
    return url


def screenshots(folder: Path, out: Path) -> None:
    """Each page of the viewer over ``folder/agents.db``, in headless Chromium, into
    ``out``."""
    import uvicorn
    from playwright.sync_api import sync_playwright

    from expstore.ui import make_app

    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(folder)  # the page shows the database as sqlite:///agents.db
    app = make_app("sqlite:///agents.db", live_every=1.0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.02)
    base = f"http://127.0.0.1:{port}"
    shots = [
        ("buffers", "/?all=1", None),
        ("rows", "/b/web/rows?limit=12", None),
        ("tasks", "/b/web/tasks?sort=-return", None),
        ("trajectory", "/b/web/task?id=task-03&where=changed(exp_data.state.screenshot)", None),
        ("trajectory-chat", "/b/web/task?id=task-00", "#step-2"),
        ("groups", "/b/rollouts/groups", None),
        ("group", "/b/rollouts/group?key=prompt-5", None),
        ("live", "/b/web/live", "live"),
        ("where-error", "/b/web/rows?where=reward_t+>>+0", None),
    ]
    chromium = os.environ.get("EXPSTORE_CHROMIUM", "/usr/bin/chromium")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            tab = browser.new_page(viewport={"width": 1280, "height": 860}, bypass_csp=True)
            for name, path, then in shots:
                tab.goto(base + path)
                tab.wait_for_load_state("networkidle")
                if then == "live":
                    tab.wait_for_function("document.getElementById('rows').textContent !== '…'")
                elif then:
                    tab.evaluate(
                        "s => { const e = document.querySelector(s); e.querySelectorAll('details')"
                        ".forEach(d => { if (!d.classList.contains('repeat')) d.open = true; });"
                        " e.scrollIntoView(); }",
                        then,
                    )
                tab.wait_for_function(
                    "[...document.images].every(i => i.loading === 'lazy' || i.complete)"
                )
                tab.screenshot(path=str(out / f"{name}.png"))
                print(f"{out / name}.png")
            browser.close()
    finally:
        server.should_exit = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=Path("ui-demo"))
    parser.add_argument("--screenshots", type=Path, default=None)
    args = parser.parse_args()
    print(build(args.folder))
    if args.screenshots is not None:
        screenshots(args.folder, args.screenshots)


if __name__ == "__main__":
    main()
