"""Minari datasets in and out: a dataset imported and exported again is equal, what we
write minari.load_dataset opens, and the export streams."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

minari = pytest.importorskip("minari")
gym = pytest.importorskip("gymnasium")
pytest.importorskip("pyarrow")
from minari.data_collector import EpisodeBuffer  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from expstore import (  # noqa: E402
    QueryBuilder,
    ReplayBuffer,
    TransitionConverter,
    UniformSampler,
    export_minari,
    import_minari,
    minari_io,  # noqa: E402
)
from expstore.cli import app  # noqa: E402
from expstore.errors import InvalidArgumentError  # noqa: E402

PARTS = ("observations", "actions", "rewards", "terminations", "truncations")


@pytest.fixture(autouse=True)
def minari_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "minari"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return root


def episodes(n: int = 5, seed: int = 0) -> list[EpisodeBuffer]:
    rng = np.random.default_rng(seed)
    made = []
    for e in range(n):
        t = int(rng.integers(3, 9))
        made.append(
            EpisodeBuffer(
                id=e,
                seed=100 + e,
                observations=rng.standard_normal((t + 1, 4)).astype(np.float32),
                actions=rng.integers(0, 2, t),
                rewards=rng.standard_normal(t),
                terminations=np.r_[np.zeros(t - 1, bool), e % 2 == 0],
                truncations=np.r_[np.zeros(t - 1, bool), e % 2 == 1],
                # (2-D: Minari's arrow storage cannot read back 1-D info arrays)
                infos={"x": rng.standard_normal((t + 1, 2)), "k": np.arange(t + 1)[:, None]},
            )
        )
    return made


def source_dataset(dataset_id: str = "test/source-v0") -> object:
    with pytest.warns(UserWarning):  # Minari's advice on the metadata left out
        return minari.create_dataset_from_buffers(
            dataset_id, episodes(), env="CartPole-v1", data_format="arrow"
        )


def assert_same_episodes(a: object, b: object) -> None:
    assert a.total_episodes == b.total_episodes and a.total_steps == b.total_steps
    assert a.observation_space == b.observation_space and a.action_space == b.action_space
    for x, y in zip(a.iterate_episodes(), b.iterate_episodes(), strict=True):
        for part in PARTS:
            u, v = getattr(x, part), getattr(y, part)
            assert u.dtype == v.dtype and u.shape == v.shape and np.array_equal(u, v), part
        assert sorted(x.infos) == sorted(y.infos)
        for key in x.infos:
            assert x.infos[key].dtype == y.infos[key].dtype
            assert np.array_equal(x.infos[key], y.infos[key])
    seeds_a = [m.get("seed") for m in a.storage.get_episode_metadata(range(a.total_episodes))]
    seeds_b = [m.get("seed") for m in b.storage.get_episode_metadata(range(b.total_episodes))]
    assert seeds_a == seeds_b


def test_a_dataset_imported_and_exported_again_is_equal(db_url: str, buffer_name: str) -> None:
    source = source_dataset()
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        assert import_minari(buffer, "test/source-v0") == source.total_steps
        assert buffer.task_ids() == [f"test/source-v0/{e}" for e in range(5)]
        exported = buffer.to_minari("test/again-v0")
    assert_same_episodes(source, exported)
    assert_same_episodes(source, minari.load_dataset("test/again-v0"))
    assert exported.spec.env_spec.id == "CartPole-v1"


def test_imported_rows_are_transitions(db_url: str, buffer_name: str) -> None:
    source = source_dataset()
    first = next(iter(source.iterate_episodes()))
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        import_minari(buffer, source, task_prefix="ep")
        rows = buffer.get_by_task_id("ep0")
        assert [r.exp_meta.step for r in rows] == list(range(len(first)))
        assert np.array_equal(rows[1].exp_data.state["observation"], first.observations[1])
        assert np.array_equal(rows[-1].exp_data.next_state["observation"], first.observations[-1])
        assert [r.exp_data.done for r in rows] == first.terminations.tolist()
        batch = buffer.sample(UniformSampler(seed=0), None, TransitionConverter(), 4)
        assert batch["observation"].shape == (4, 4) and batch["next_observation"].shape == (4, 4)


def test_rows_written_by_hand_export_with_spaces_given(db_url: str, buffer_name: str) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        for task, length in (("a", 3), ("b", 2)):
            obs = np.arange(length + 1, dtype=np.float32)[:, None].repeat(2, 1)
            buffer.extend(
                {
                    "task_id": task,
                    "agent_id": "me",
                    "step": list(range(length)),
                    "state": {"observation": obs[:-1]},
                    "next_state": {"observation": obs[1:]},
                    "actions": [[np.float32(0.5)]] * length,
                    "reward_t": [1.0] * length,
                    "done": [False] * (length - 1) + [True],
                }
            )
        with pytest.raises(InvalidArgumentError, match="give observation_space= and"):
            buffer.to_minari("test/hand-v0")
        box = gym.spaces.Box(-10, 10, (2,), np.float32)
        act = gym.spaces.Box(-1, 1, (), np.float32)
        kw = {"observation_space": box, "action_space": act}
        dataset = buffer.to_minari("test/hand-v0", **kw)
        only_b = buffer.to_minari("test/hand-b-v0", QueryBuilder().eq("task_id", "b").build(), **kw)
        with pytest.raises(InvalidArgumentError, match="overwrite=True"):
            buffer.to_minari("test/hand-v0", **kw)
        buffer.to_minari("test/hand-v0", overwrite=True, **kw)
    got = list(dataset.iterate_episodes())
    assert [len(e) for e in got] == [3, 2]
    assert got[0].observations[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert got[1].terminations.tolist() == [False, True]
    assert got[0].actions.dtype == np.float32 and not got[0].truncations.any()
    assert only_b.total_episodes == 1 and only_b.total_steps == 2


def test_export_streams_with_flat_memory(
    tmp_path: Path, buffer_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Peak memory follows the chunk, not the buffer: 4x the steps, about the same peak."""
    monkeypatch.setattr(minari_io, "CHUNK_STEPS", 200)
    box = gym.spaces.Box(-np.inf, np.inf, (256,), np.float32)
    kw = {"observation_space": box, "action_space": gym.spaces.Discrete(2)}
    peaks = []
    for episodes_n in (10, 40):
        with ReplayBuffer(f"sqlite:///{tmp_path / f'{episodes_n}.db'}", name=buffer_name) as buf:
            for e in range(episodes_n):
                obs = np.full((51, 256), e, np.float32)  # 50 steps of 1 KB
                buf.extend(
                    {
                        "task_id": f"e{e}",
                        "agent_id": "a",
                        "step": list(range(50)),
                        "state": {"observation": obs[:-1]},
                        "next_state": {"observation": obs[1:]},
                        "actions": [[1]] * 50,
                        "reward_t": [0.0] * 50,
                        "done": [False] * 49 + [True],
                    }
                )
            tracemalloc.start()
            dataset = export_minari(buf, f"test/flat{episodes_n}-v0", **kw)
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
            assert dataset.total_steps == episodes_n * 50
    assert peaks[1] < 1.5 * peaks[0], peaks


def test_cli_export_and_import_minari(tmp_path: Path, minari_root: Path) -> None:
    source_dataset()
    runner = CliRunner()
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    done = runner.invoke(app, ["import", "--db", db, "--format", "minari", "test/source-v0"])
    assert done.exit_code == 0, done.output
    assert "Imported 27 steps of Minari dataset 'test/source-v0'" in done.output
    out = ["export", "--db", db, "--format", "minari", "test/cli-v0"]
    done = runner.invoke(app, out)
    assert done.exit_code == 0, done.output
    assert "Exported 27 steps in 5 episodes" in done.output
    again = runner.invoke(app, out)
    assert again.exit_code != 0 and "--overwrite" in again.output
    assert runner.invoke(app, [*out, "--overwrite"]).exit_code == 0
    assert_same_episodes(minari.load_dataset("test/source-v0"), minari.load_dataset("test/cli-v0"))
    elsewhere = tmp_path / "elsewhere"
    done = runner.invoke(
        app, ["export", "--db", db, "-f", "minari", "test/x-v0", "--minari-root", str(elsewhere)]
    )
    assert done.exit_code == 0, done.output
    assert (elsewhere / "test" / "x-v0").is_dir()


def test_import_of_an_unknown_dataset_says_so(buffer: ReplayBuffer) -> None:
    with pytest.raises(InvalidArgumentError, match="no Minari dataset 'nope/none-v0'"):
        import_minari(buffer, "nope/none-v0")
