"""``expstore demo`` runs the whole pipeline with several writer processes, quickly."""

from __future__ import annotations

from pathlib import Path

from expstore import ReplayBuffer
from expstore.demo import run_demo
from tests.cli.conftest import Invoke


def test_demo_command_writes_from_several_processes_and_trains(
    invoke: Invoke, tmp_path: Path
) -> None:
    result = invoke("demo", "--workdir", str(tmp_path / "demo"), "--episodes", "15")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    for heading in ("1. Writing", "2. Querying", "3. Sampling", "4. Training", "Done in"):
        assert heading in out
    assert "(none lost)" in out
    assert "StratifiedSampler batch of 512 by agent: agent-0 25%" in out
    pids = {line.split("(pid ")[1].split(",")[0] for line in out.splitlines() if "(pid " in line}
    assert len(pids) == 4  # four processes wrote
    with ReplayBuffer(f"sqlite:///{tmp_path / 'demo' / 'demo.db'}", name="demo") as buffer:
        stats = invoke(
            "stats", "--db", f"sqlite:///{tmp_path / 'demo' / 'demo.db'}", "-b", "demo", "--json"
        )
        assert stats.exit_code == 0
        assert buffer.count() > 60
        assert len(buffer.task_ids()) == 60


def test_demo_numbers_are_the_same_on_every_run_and_numpy_training_learns(
    tmp_path: Path,
) -> None:
    lines: list[str] = []
    first = run_demo(
        workdir=tmp_path, agents=2, episodes=10, train_steps=60, backend="numpy", echo=lines.append
    )
    again: list[str] = []
    second = run_demo(
        workdir=tmp_path, agents=2, episodes=10, train_steps=60, backend="numpy", echo=again.append
    )
    assert first.backend == "numpy"
    assert first.rows == second.rows  # the episodes depend on the seed alone
    assert first.per_agent == second.per_agent
    assert not any("emptied buffer" in line for line in lines)
    assert any(f"emptied buffer 'demo', which held {first.rows} rows" in line for line in again)
    assert first.trained_success > first.baseline_success + 0.3


def test_demo_on_postgres(invoke: Invoke, tmp_path: Path, pg_url: str) -> None:
    result = invoke(
        "demo",
        "--db",
        pg_url,
        "--workdir",
        str(tmp_path),
        "--agents",
        "2",
        "--episodes",
        "5",
        "--train-steps",
        "10",
        "--backend",
        "numpy",
    )
    assert result.exit_code == 0, result.stderr
    assert "(none lost)" in result.stdout
    assert not (tmp_path / "demo.db").exists()


def test_demo_agents_also_run_as_spawned_processes(tmp_path: Path) -> None:
    result = run_demo(
        workdir=tmp_path,
        agents=2,
        episodes=3,
        train_steps=5,
        backend="numpy",
        start_method="spawn",
        echo=lambda s: None,
    )
    assert result.rows > 0 and result.episodes == 6
