"""``expstore stats --plot FILE.png``: what people look at when agents learn.

Three panels, from the buffer's episodes (a task is an episode; its return is the sum of
its rows' rewards; it succeeds when its last step's reward is above ``--success-above``):

- per-episode return per agent over time (a rolling mean over episodes, by when each
  episode ended);
- success rate per agent over time (rolling, the same way);
- per agent: mean return and success rate over all its episodes, as bars.

Needs matplotlib (``pip install 'expstore[plot]'``); without it the plot is skipped with a
message and the statistics are printed as usual.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..buffer import ReplayBuffer
from ..query import QueryCondition

__all__ = ["episodes", "plot_stats"]

_COLUMNS = ("task_id", "agent_id", "step", "reward_t", "execute_time")


def episodes(index: dict[str, np.ndarray], success_above: float) -> dict[str, np.ndarray]:
    """Per episode (task): its agent (of its last row), return, success and end time."""
    task_ids = index["task_id"].astype(str)
    names, inverse = np.unique(task_ids, return_inverse=True)
    inverse = inverse.reshape(-1)
    rewards = np.nan_to_num(index["reward_t"], nan=0.0)
    returns = np.bincount(inverse, weights=rewards, minlength=len(names))
    order = np.lexsort((index["key"], index["step"], inverse))
    last = order[np.cumsum(np.bincount(inverse, minlength=len(names))) - 1]
    final = index["reward_t"][last]
    ends = np.full(len(names), -np.inf)
    np.maximum.at(ends, inverse, index["execute_time"])
    return {
        "agent": index["agent_id"][last].astype(str),
        "return": returns,
        "success": np.nan_to_num(final, nan=-np.inf) > success_above,
        "end": ends,
    }


def _rolling(values: np.ndarray, window: int) -> np.ndarray:
    """The mean of the last ``window`` values at each position (fewer at the start)."""
    sums = np.cumsum(np.concatenate([[0.0], values.astype(float)]))
    counts = np.minimum(np.arange(1, len(values) + 1), window)
    ends = np.arange(1, len(values) + 1)
    means: np.ndarray = (sums[1:] - sums[np.maximum(ends - window, 0)]) / counts
    return means


def plot_stats(
    buffer: ReplayBuffer,
    query_condition: QueryCondition,
    path: Path,
    *,
    success_above: float = 0.0,
) -> str | None:
    """Draw the panels into ``path``; None when drawn, else why not (no matplotlib, no
    episodes)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "it needs matplotlib, which is not installed (pip install 'expstore[plot]')"
    index = buffer.storage.key_index(query_condition, _COLUMNS)
    if not len(index["key"]):
        return "no rows match"
    eps = episodes(index, success_above)
    start = float(eps["end"].min())
    span = float(eps["end"].max()) - start
    unit, scale = ("minutes", 60.0) if span > 600 else ("seconds", 1.0)
    agents = sorted(set(eps["agent"].tolist()))
    fig = plt.figure(figsize=(12, 7.5))
    grid = fig.add_gridspec(2, 2, width_ratios=(2.2, 1))
    ret_ax, ok_ax = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[1, 0])
    bar_ax = fig.add_subplot(grid[:, 1])
    colors: dict[str, Any] = {}
    for agent in agents:
        mine = np.flatnonzero(eps["agent"] == agent)
        mine = mine[np.argsort(eps["end"][mine], kind="stable")]
        window = max(1, min(50, len(mine) // 5))
        when = (eps["end"][mine] - start) / scale
        (line,) = ret_ax.plot(when, _rolling(eps["return"][mine], window), label=agent)
        colors[agent] = line.get_color()
        ok_ax.plot(when, 100 * _rolling(eps["success"][mine], window), color=colors[agent])
    ret_ax.set_title("Episode return per agent (rolling mean over episodes)")
    ret_ax.set_ylabel("return")
    ok_ax.set_title("Success rate per agent (rolling)")
    ok_ax.set_ylabel("success, %")
    ok_ax.set_ylim(-3, 103)
    ok_ax.set_xlabel(f"{unit} since the first episode ended")
    ret_ax.legend(loc="best", fontsize="small", ncols=2 if len(agents) > 6 else 1)
    for ax in (ret_ax, ok_ax):
        ax.grid(alpha=0.3)
    positions = np.arange(len(agents))
    means = [float(eps["return"][eps["agent"] == a].mean()) for a in agents]
    rates = [100 * float(eps["success"][eps["agent"] == a].mean()) for a in agents]
    counts = [int((eps["agent"] == a).sum()) for a in agents]
    bars = bar_ax.barh(positions, rates, color=[colors[a] for a in agents], alpha=0.85)
    for bar, mean, count in zip(bars, means, counts, strict=True):
        bar_ax.text(
            bar.get_width() + 1,
            bar.get_y() + bar.get_height() / 2,
            f"return {mean:.2f}, {count} episodes",
            va="center",
            fontsize="small",
        )
    bar_ax.set_yticks(positions, agents)
    bar_ax.invert_yaxis()
    bar_ax.set_xlim(0, 150)
    bar_ax.set_xticks([0, 25, 50, 75, 100])
    bar_ax.set_xlabel("success rate over all episodes, %")
    bar_ax.set_title("Per agent")
    fig.suptitle(f"buffer {buffer.storage.name!r}: {len(eps['return'])} episodes", fontsize="large")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
