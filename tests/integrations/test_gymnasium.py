"""EpisodeRecorder and VectorEpisodeRecorder: episodes as tasks, the final observation
kept as Minari's DataCollector keeps it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")
minari = pytest.importorskip("minari")

from expstore import ReplayBuffer, TransitionConverter, UniformSampler  # noqa: E402
from expstore.integrations.gymnasium import (  # noqa: E402
    EpisodeRecorder,
    VectorEpisodeRecorder,
)


@pytest.fixture(autouse=True)
def minari_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))


def _terminal(obs: np.ndarray) -> bool:
    """CartPole ends when the cart leaves [-2.4, 2.4] or the pole passes 12 degrees."""
    return bool(abs(obs[0]) > 2.4 or abs(obs[2]) > 0.2095)


def test_recorded_episodes_are_the_environments(db_url: str, buffer_name: str) -> None:
    twin = gym.make("CartPole-v1")
    rng = np.random.default_rng(0)
    expected = []
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        env = EpisodeRecorder(gym.make("CartPole-v1"), buffer, flush_steps=16, record_infos=True)
        for seed in range(3):
            env.reset(seed=seed)
            observations = [twin.reset(seed=seed)[0]]
            actions, done = [], False
            while not done:
                action = int(rng.integers(2))
                _, _, terminated, truncated, _ = env.step(action)
                observations.append(twin.step(action)[0])
                actions.append(action)
                done = terminated or truncated
            expected.append((np.stack(observations), np.array(actions)))
        env.close()
        assert env.steps_written == buffer.count() == sum(len(a) for _, a in expected)
        rows = buffer.get_by_task_id(buffer.task_ids()[0])
        assert rows[0].exp_data.ext_info["reset_info"] == {}
        for a, b in zip(rows, rows[1:], strict=False):
            assert np.array_equal(
                a.exp_data.next_state["observation"], b.exp_data.state["observation"]
            )
        batch = buffer.sample(UniformSampler(seed=0), None, TransitionConverter(), 8)
        assert batch["observation"].shape == batch["next_observation"].shape == (8, 4)
        dataset = buffer.to_minari("test/recorded-v0")
    got = list(dataset.iterate_episodes())
    assert len(got) == 3
    for (observations, actions), episode in zip(expected, got, strict=True):
        assert np.array_equal(episode.observations, observations)
        assert np.array_equal(episode.actions, actions)
        assert episode.terminations[-1] and _terminal(episode.observations[-1])
    seeds = [m["seed"] for m in dataset.storage.get_episode_metadata(range(3))]
    assert seeds == [0, 1, 2]
    assert dataset.spec.env_spec.id == "CartPole-v1"
    assert minari.load_dataset("test/recorded-v0").total_steps == dataset.total_steps


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_vector_recorder_keeps_each_final_observation(
    db_url: str, buffer_name: str, mode: str
) -> None:
    autoreset = gym.vector.AutoresetMode[mode.upper()]
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        venv = VectorEpisodeRecorder(
            gym.make_vec(
                "CartPole-v1",
                num_envs=3,
                vectorization_mode="sync",
                vector_kwargs={"autoreset_mode": autoreset},
            ),
            buffer,
        )
        venv.reset(seed=1)
        venv.action_space.seed(1)
        for _ in range(200):
            venv.step(venv.action_space.sample())
        venv.close()
        dataset = buffer.to_minari(f"test/vector-{mode.replace('_', '')}-v0")
    ended = 0
    for episode in dataset.iterate_episodes():
        assert len(episode.observations) == len(episode.actions) + 1
        assert np.all(np.abs(episode.observations[0]) <= 0.05)  # a reset's observation
        assert not any(_terminal(o) for o in episode.observations[:-1])
        if episode.terminations[-1]:
            ended += 1
            assert _terminal(episode.observations[-1])  # the final one, not the next reset
    assert ended >= 10
    assert dataset.total_steps == (600 - ended if mode == "next_step" else 600)
