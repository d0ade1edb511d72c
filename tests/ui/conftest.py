"""A database the viewer's tests look at, on both backends: a web agent's trajectories with
screenshots (and an agent output that tries to run script), and GRPO groups with policy
versions, a held claim and a rate limit."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from expstore import DataRow, Experience, ExpMeta, RateLimiter, ReplayBuffer

XSS = "<script>window.__pwned = 1; alert('xss')</script><img src=x onerror=alert(1)>"


def screenshot(task: int, step: int) -> np.ndarray:
    """A page-like 720p screenshot, different per task and step."""
    image = np.full((720, 1280, 3), 245, np.uint8)
    image[:60] = (36, 88, 179)
    image[100 + 40 * step : 160 + 40 * step, 100:700] = (200, 210, 220)
    image[300:340, 100 + 90 * task : 400 + 90 * task] = (60, 160, 90)
    return image


@dataclass
class UiData:
    url: str
    web: str
    groups: str
    #: id of the row whose assistant message tries to run script
    xss_row: str


@pytest.fixture
def ui_data(db_url: str, buffer_name: str) -> Iterator[UiData]:
    web, groups = buffer_name + "_web", buffer_name + "_groups"
    rng = np.random.default_rng(0)
    with ReplayBuffer(db_url, name=web) as buffer:
        rows = []
        for t in range(5):
            for s in range(4):
                rows.append(
                    DataRow(
                        id=f"web-{t}-{s}",
                        exp_meta=ExpMeta(
                            task_id=f"shop-{t}", agent_id=f"agent{t % 2}", step=s, policy_version=t
                        ),
                        exp_data=Experience(
                            state={
                                "url": f"https://shop.example/{t}/{s}",
                                "screenshot": screenshot(t, s),
                            },
                            actions=[{"name": "click", "x": 100 + s, "y": 200}],
                            reward_t=float(s == 3 and t % 2 == 0),
                            messages=[
                                {"role": "user", "content": f"Buy item {t}"},
                                {
                                    "role": "assistant",
                                    "content": XSS if (t, s) == (1, 2) else "click Buy",
                                },
                            ],
                            done=s == 3,
                        ),
                    )
                )
        buffer.store_batch(rows)
    with ReplayBuffer(db_url, name=groups) as buffer:
        buffer.set_policy_version(0, force=True)
        for p in range(6):
            buffer.store_batch(
                [
                    DataRow(
                        id=f"g{p}-{i}",
                        exp_meta=ExpMeta(
                            task_id=f"prompt{p}", agent_id=f"c{i}", step=i, policy_version=p // 2
                        ),
                        exp_data=Experience(
                            state={"tokens": rng.integers(0, 500, 16).astype(np.int32)},
                            reward_t=float(i % 2),
                            messages=[
                                {"role": "user", "content": f"What is {p}+{i}?"},
                                {"role": "assistant", "content": f"The answer is {p + i}."},
                            ],
                        ),
                    )
                    for i in range(4)
                ]
            )
        buffer.set_policy_version(3)
        buffer.claim(4, consumer="learner-0")  # prompt0's group, held
        buffer.set_rate_limiter(RateLimiter(min_size=4, samples_per_insert=2.0, error_buffer=100))
    yield UiData(db_url, web, groups, "web-1-2")
