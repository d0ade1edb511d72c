"""``expstore demo``: several agent processes, one store, sampling and a little training."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from ..demo import run_demo
from ._common import parse_url


class Backend(str, Enum):
    torch = "torch"
    numpy = "numpy"


def demo(
    workdir: Annotated[
        Path,
        typer.Option("--workdir", metavar="DIR", help="Where the demo's SQLite file goes."),
    ] = Path("expstore-demo"),
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            metavar="URL",
            help="Use this database instead of DIR/demo.db (its buffer 'demo' is emptied).",
        ),
    ] = None,
    agents: Annotated[
        int, typer.Option("--agents", min=1, max=32, metavar="N", help="Agent processes.")
    ] = 4,
    episodes: Annotated[
        int, typer.Option("--episodes", min=1, metavar="N", help="Episodes each agent plays.")
    ] = 40,
    train_steps: Annotated[
        int,
        typer.Option("--train-steps", min=1, metavar="N", help="Training steps (one batch each)."),
    ] = 150,
    seed: Annotated[
        int, typer.Option("--seed", metavar="S", help="Seed for episodes and sampling.")
    ] = 0,
    backend: Annotated[
        Backend | None,
        typer.Option("--backend", help="Train with torch or numpy (default: torch if installed)."),
    ] = None,
) -> None:
    """Run the whole pipeline on a SQLite file in a few seconds.

    Several agent processes play a small grid world and write their episodes into one
    SQLite file at the same time; then the demo queries by task and by agent, samples
    batches with two samplers through a converter, and trains a small policy on sampled
    batches (torch if installed, else numpy), printing what happens.

    \b
    Example:
      expstore demo --workdir /tmp/expstore-demo
    """
    if db is not None:
        parse_url(db)
    run_demo(
        db,
        workdir,
        agents=agents,
        episodes=episodes,
        train_steps=train_steps,
        seed=seed,
        backend=backend.value if backend else None,
        echo=typer.echo,
    )
