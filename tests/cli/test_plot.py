"""``expstore stats --plot``: episode return and success per agent over time and a per-agent
bar chart, drawn into a PNG that opens, has the size asked and is not blank; the docs'
picture (docs/stats.png, drawn from the demo's data) likewise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from expstore import ReplayBuffer
from expstore.cli.plot import episodes
from tests.helpers import make_row

matplotlib = pytest.importorskip("matplotlib")  # in the test extra, so CI has it
from matplotlib import image  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _check_png(path: Path) -> None:
    assert path.read_bytes().startswith(b"\x89PNG")
    pixels = image.imread(path)
    height, width = pixels.shape[:2]
    assert width >= 1000 and height >= 600
    rgb = pixels[..., :3].reshape(-1, 3)
    assert rgb.std() > 0.05  # not blank
    colours = {tuple(np.round(p, 1)) for p in rgb[:: max(1, len(rgb) // 20000)]}
    assert len(colours) >= 6  # lines and bars in several colours, not one flat fill


def _fill(url: str) -> None:
    rows = []
    rng = np.random.default_rng(0)
    for episode in range(60):
        agent = f"agent{episode % 3}"
        good = rng.random() < (0.3 + 0.3 * (episode % 3))
        for step in range(4):
            reward = 1.0 if good and step == 3 else 0.0
            rows.append(
                make_row(
                    f"ep{episode}",
                    agent,
                    step,
                    reward=reward,
                    execute_time=1e9 + episode * 10 + step,
                )
            )
    with ReplayBuffer(url, name="plot") as buffer:
        buffer.store_batch(rows)


def test_stats_plot_draws_return_success_and_bars(invoke: Any, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    _fill(url)
    out = tmp_path / "stats.png"
    result = invoke("stats", url, "-b", "plot", "--plot", str(out))
    assert result.exit_code == 0, result.stderr
    assert f"Wrote {out}" in result.stderr
    _check_png(out)


def test_episodes_are_tasks_with_their_return_success_and_agent() -> None:
    index = {
        "key": np.arange(6),
        "task_id": np.array(["a", "a", "b", "b", "b", "c"], dtype=object),
        "agent_id": np.array(["x", "x", "y", "y", "y", "x"], dtype=object),
        "step": np.array([0, 1, 0, 2, 1, 0]),
        "reward_t": np.array([0.5, 1.0, 0.0, 0.0, 2.0, np.nan]),
        "execute_time": np.array([1.0, 2.0, 3.0, 9.0, 4.0, 5.0]),
    }
    eps = episodes(index, 0.0)
    assert eps["agent"].tolist() == ["x", "y", "x"]
    assert eps["return"].tolist() == [1.5, 2.0, 0.0]
    assert eps["success"].tolist() == [True, False, False]  # b's last step (2) has reward 0
    assert eps["end"].tolist() == [2.0, 9.0, 5.0]


def test_the_docs_picture_opens_and_is_not_blank() -> None:
    path = ROOT / "docs" / "stats.png"
    assert path.stat().st_size > 20_000
    _check_png(path)
    assert "](stats.png)" in (ROOT / "docs" / "cli.md").read_text()
