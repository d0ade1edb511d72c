"""Every example in examples/ runs as it is (a smoke test each, a few seconds)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from expstore import QueryBuilder, ReplayBuffer

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def run_example(name: str, *args: str, cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("EXPSTORE_URL", None)
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, f"{name} failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout


def test_every_example_has_a_smoke_test() -> None:
    tested = {
        "quickstart.py",
        "multiprocess_writers.py",
        "web_agent_sft.py",
        "behavior_cloning.py",
        "reward_prioritized.py",
        "postgres.py",
        "async_actor_learner.py",
        "async_grpo.py",
        "long_messages_sampler.py",
        "durable_actors.py",
        "aworld_agent_to_training.py",
        "asyncio_rollouts.py",
        "torchrl_dqn.py",
        "minari_roundtrip.py",
    }
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested


def test_quickstart(tmp_path: Path) -> None:
    out = run_example("quickstart.py", cwd=tmp_path)
    assert "stored 18 rows in 6 tasks" in out
    assert "sample_task: [[0, 1, 2], [0, 1, 2]]" in out


def test_quickstart_on_a_sqlite_file(tmp_path: Path) -> None:
    out = run_example("quickstart.py", "--db", "sqlite:///quick.db", cwd=tmp_path)
    assert "stored 18 rows" in out
    assert (tmp_path / "quick.db").exists()


def test_multiprocess_writers(tmp_path: Path) -> None:
    out = run_example("multiprocess_writers.py", "--workers", "3", "--tasks", "5", cwd=tmp_path)
    assert "3 processes wrote 150 rows (150 expected)" in out


def test_async_actor_learner_consumes_every_row_once_through_a_kill(tmp_path: Path) -> None:
    out = run_example("async_actor_learner.py", "--episodes", "20", cwd=tmp_path)
    assert "learner-1: killed with SIGKILL after step" in out
    assert "learner-1: resumed from its checkpoint at step" in out
    assert "every one of 480 rows was consumed exactly once" in out


def test_async_grpo_trains_on_fresh_varied_groups_within_its_budget(tmp_path: Path) -> None:
    out = run_example("async_grpo.py", "--steps", "6", "--workers", "2", cwd=tmp_path)
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(steps) == 6 and all("filtered" in s and "stale" in s for s in steps)
    assert "rows sampled for" in out and "done: 6 steps" in out


def test_async_grpo_on_postgres(tmp_path: Path, pg_url: str, buffer_name: str) -> None:
    out = run_example(
        "async_grpo.py", "--db", pg_url, "--buffer", buffer_name, "--steps", "4", cwd=tmp_path
    )
    assert "done: 4 steps" in out


def test_durable_actors_lose_nothing_while_killed(tmp_path: Path) -> None:
    args = ("--prompts", "16", "--tokens", "24", "--kill-every", "0.6")
    out = run_example("durable_actors.py", *args, cwd=tmp_path)
    killed = re.search(r"(\d+) actors SIGKILLed", out)
    assert killed is not None and int(killed.group(1)) >= 1
    assert "every group consumed once" in out
    assert "every completion stored once, token for token" in out


def test_durable_actors_on_postgres(tmp_path: Path, pg_url: str, buffer_name: str) -> None:
    args = ("--db", pg_url, "--name", buffer_name, "--prompts", "8", "--tokens", "16")
    out = run_example("durable_actors.py", *args, cwd=tmp_path)
    assert "every completion stored once, token for token" in out


def test_aworld_agent_runs_are_recorded_then_sampled_and_claimed(tmp_path: Path) -> None:
    if importlib.util.find_spec("aworld.core.storage") is None:  # AWorld 0.3: the aworld extra
        if os.environ.get("EXPSTORE_REQUIRE_AWORLD") == "1":
            pytest.fail("EXPSTORE_REQUIRE_AWORLD=1 but AWorld 0.3.2 is not installed")
        pytest.skip("AWorld 0.3.2 is not installed: pip install -e '.[aworld]'")
    out = run_example("aworld_agent_to_training.py", "--tasks", "4", "--workdir", ".", cwd=tmp_path)
    assert out.count("2 steps") == 4 and "The answer is 4." in out
    assert "expstore holds 8 steps of 4 AWorld tasks" in out
    assert "SFT: 3 records of right answers" in out  # 3 squared is answered wrong
    rl_steps = [line for line in out.splitlines() if line.startswith("RL step: 2 trajectories")]
    assert len(rl_steps) == 2  # every trajectory claimed once, in groups of two
    assert (tmp_path / "trajectories.db").is_file()


def test_web_agent_sft_writes_llama_factory_data(tmp_path: Path) -> None:
    out = run_example("web_agent_sft.py", "--out", "sft", "--samples", "8", cwd=tmp_path)
    assert "wrote 8 SFT records" in out
    records = json.loads((tmp_path / "sft" / "sft.json").read_text())
    assert len(records) == 8
    assert records[0]["messages"][-1]["role"] == "assistant"
    assert records[0]["images"][0].startswith("screenshots/")
    assert (tmp_path / "sft" / records[0]["images"][0]).read_bytes().startswith(b"\x89PNG")
    assert "distinct pages" in out
    info = json.loads((tmp_path / "sft" / "dataset_info.json").read_text())
    assert info["webgym_sft"]["formatting"] == "sharegpt"


def test_behavior_cloning(tmp_path: Path) -> None:
    out = run_example("behavior_cloning.py", "--steps", "20", cwd=tmp_path)
    assert "the buffer keeps the newest 400 (capacity 400)" in out
    assert "DigiRL batch keys: observation, action, image_features" in out


def test_reward_prioritized(tmp_path: Path) -> None:
    out = run_example("reward_prioritized.py", cwd=tmp_path)
    lines = out.splitlines()
    assert "the buffer keeps the best 200" in lines[0]
    uniform = float(lines[1].split("mean reward ")[1].split(",")[0])
    weighted = float(lines[2].split("mean reward ")[1].split(",")[0])
    assert weighted > uniform


def test_postgres_many_writers_one_trainer(tmp_path: Path, pg_url: str, buffer_name: str) -> None:
    out = run_example(
        "postgres.py",
        "--db",
        pg_url,
        "--buffer",
        buffer_name,
        "--writers",
        "2",
        "--episodes",
        "10",
        cwd=tmp_path,
    )
    assert "2 writers stored 160 rows" in out


@pytest.mark.parametrize("example", ["multiprocess_writers.py"])
def test_writers_example_on_postgres(
    tmp_path: Path, pg_url: str, buffer_name: str, example: str
) -> None:
    out = run_example(
        example,
        "--db",
        pg_url,
        "--buffer",
        buffer_name,
        "--workers",
        "2",
        "--tasks",
        "3",
        cwd=tmp_path,
    )
    assert "2 processes wrote 60 rows (60 expected)" in out


def _long_messages() -> Any:
    """examples/long_messages_sampler.py as a module (it is not a package)."""
    spec = importlib.util.spec_from_file_location(
        "long_messages", EXAMPLES / "long_messages_sampler.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_long_messages_sampler_example(tmp_path: Path) -> None:
    out = run_example("long_messages_sampler.py", "--rows", "2000", cwd=tmp_path)
    uniform, weighted = (
        float(line.split("mean messages ")[1].split(" ")[0]) for line in out.splitlines()[:2]
    )
    assert uniform < 8.5 < 9.0 < weighted  # 7.5 and 10.0 expected


@pytest.mark.parametrize("flat", [True, False])
def test_a_sampler_written_against_the_public_primitives_alone(
    db_url: str, buffer_name: str, flat: bool
) -> None:
    """The example's sampler draws in proportion to 1 + min(messages, cap) on both
    backends, over the key space (probing candidates, holding no key index) and over the
    key index, under a condition too."""
    example = _long_messages()
    source = (EXAMPLES / "long_messages_sampler.py").read_text()
    assert "expstore._" not in source and "expstore.storage" not in source
    assert "sqlalchemy" not in source
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(example.rows_with_messages(600, seed=1))
        sampler = example.LongMessagesSampler(cap=7, seed=3)
        sampler.flat = flat
        spaces = buffer.sql.spaces
        probed = spaces.keys_probed
        agent1 = QueryBuilder().eq("agent_id", "agent1").build()
        drawn = [r for _ in range(30) for r in buffer.sample(sampler, agent1, batch_size=200)]
        assert all(r.exp_meta.agent_id == "agent1" for r in drawn)
        assert (spaces.keys_probed > probed) == flat  # over the key space, or not at all
        assert (len(buffer.sql.index.entries) > 0) == (not flat)
        stored = [r for r in buffer.query(agent1)]
        weight = {r.id: 1 + min(len(r.exp_data.messages or []), 7) for r in stored}
        total = sum(weight.values())
        # each row's expected share against what was drawn, summed by length
        expected: Counter[int] = Counter()
        for r in stored:
            expected[min(len(r.exp_data.messages or []), 7)] += weight[r.id] / total
        seen = Counter(min(len(r.exp_data.messages or []), 7) for r in drawn)
        for length, share in expected.items():
            assert abs(seen[length] / len(drawn) - share) < 0.03, (length, seen, expected)


def test_asyncio_rollouts(tmp_path: Path) -> None:
    """Sixteen agents and a learner on one event loop: every step stored and consumed."""
    out = run_example(
        "asyncio_rollouts.py", "--url", f"sqlite:///{tmp_path / 'r.db'}", cwd=tmp_path
    )
    assert "16 agents stored 768 steps" in out
    assert "the learner consumed 768 steps; checkpoint step > 0: True" in out
    assert "episodes ended: 64" in out
    assert "unclaimed 0, leased 0, consumed 768" in out


def test_torchrl_dqn_collectors_write_one_buffer(tmp_path: Path) -> None:
    pytest.importorskip("torchrl")
    out = run_example("torchrl_dqn.py", "--frames", "600", cwd=tmp_path)
    assert "buffer: 1152 transitions in the database (1152 expected)" in out
    assert "per collector: [576, 576]" in out
    learned = re.search(r"learner: (\d+) gradient steps", out)
    assert learned is not None and int(learned.group(1)) > 0


def test_torchrl_dqn_on_postgres(tmp_path: Path, pg_url: str, buffer_name: str) -> None:
    pytest.importorskip("torchrl")
    args = ("--db", pg_url, "--buffer", buffer_name, "--frames", "600")
    out = run_example("torchrl_dqn.py", *args, cwd=tmp_path)
    assert "buffer: 1152 transitions in the database (1152 expected)" in out


def test_minari_roundtrip(tmp_path: Path) -> None:
    pytest.importorskip("minari")
    out = run_example("minari_roundtrip.py", "--episodes", "5", cwd=tmp_path)
    assert "recorded" in out and "in 5 episodes" in out
    assert "minari.load_dataset: 5 episodes" in out
    assert "exported again: same episodes: True" in out


def test_minari_roundtrip_on_postgres(tmp_path: Path, pg_url: str, buffer_name: str) -> None:
    pytest.importorskip("minari")
    args = ("--db", pg_url, "--buffer", buffer_name, "--episodes", "3")
    out = run_example("minari_roundtrip.py", *args, cwd=tmp_path)
    assert "exported again: same episodes: True" in out
