"""Minari datasets out of a buffer and into one: episodes are tasks, steps are rows.

Minari (Farama's offline-RL format, 0.5) keeps per episode ``observations`` (one more than
the steps: the final observation last), ``actions``, ``rewards``, ``terminations``,
``truncations`` and ``infos``, with the dataset's observation and action spaces. A buffer
holds them as the rows :class:`~expstore.TransitionConverter` reads (:data:`FIELDS`)::

    observations[t]      exp_data.state.observation        (row t of the task)
    observations[T]      exp_data.next_state.observation   (of the last row)
    actions[t]           exp_data.actions                  (the row's single action)
    rewards[t]           exp_data.reward_t
    terminations[t]      exp_data.done
    truncations[t]       exp_data.ext_info.truncated
    infos[t + 1]         exp_data.ext_info.info            (infos[0]: the first row's
                                                            exp_data.ext_info.reset_info)

and the first row of each episode keeps the dataset's facts in ``exp_data.ext_info.minari``
(the spaces as Minari serialises them, the environment's spec, the episode's seed), so a
dataset imported and exported again is equal, and :class:`~expstore.integrations.
gymnasium.EpisodeRecorder` records the same. Other paths by the ``fields`` argument.

>>> import_minari(buffer, "D4RL/door/human-v2")          # -> steps stored
>>> export_minari(buffer, "cartpole/expstore-v0")        # minari.load_dataset() opens it

Export streams: a few hundred episodes' rows at a time are read (their tensors stacked by
the database fetch), written by Minari's own storage and dropped, so memory stays flat
however large the buffer. Import streams Minari's episodes likewise, one transaction per
chunk of episodes. Minari needs ``pip install 'expstore[minari]'`` (minari, pyarrow for its
``arrow`` format, the default here; ``hdf5`` needs h5py).
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from ._optional import require
from .errors import InvalidArgumentError
from .model.paths import MISSING
from .query import QueryBuilder, QueryCondition
from .storage.base import Storage

__all__ = ["FIELDS", "export_minari", "import_minari"]

#: Where each part of a Minari episode lives in a row (see the module's docstring).
FIELDS: dict[str, str] = {
    "observation": "exp_data.state.observation",
    "next_observation": "exp_data.next_state.observation",
    "action": "exp_data.actions",
    "reward": "exp_data.reward_t",
    "termination": "exp_data.done",
    "truncation": "exp_data.ext_info.truncated",
    "info": "exp_data.ext_info.info",
    "reset_info": "exp_data.ext_info.reset_info",
    "minari": "exp_data.ext_info.minari",
}
#: Rows read (export) or stored (import) together.
CHUNK_STEPS = 20_000

Progress = Callable[[int], None]


class Rows(Protocol):
    """What export and import use of a buffer: a :class:`~expstore.ReplayBuffer` is one."""

    @property
    def storage(self) -> Storage:
        """Where the rows live."""

    def extend(self, columns: Mapping[str, Any]) -> int:
        """Store the rows of a dict of columns in one transaction."""


def _minari(purpose: str) -> Any:
    return require("minari", purpose)


@contextlib.contextmanager
def _datasets_root(root: str | os.PathLike[str] | None) -> Iterator[None]:
    """Minari's datasets directory (``MINARI_DATASETS_PATH``) set to ``root`` meanwhile."""
    if root is None:
        yield
        return
    before = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = os.fspath(root)
    try:
        yield
    finally:
        if before is None:
            del os.environ["MINARI_DATASETS_PATH"]
        else:
            os.environ["MINARI_DATASETS_PATH"] = before


def _fields(fields: Mapping[str, str] | None) -> dict[str, str]:
    unknown = sorted(set(fields or ()) - set(FIELDS))
    if unknown:
        raise InvalidArgumentError(
            f"fields names parts of a Minari episode ({', '.join(FIELDS)}); got {unknown}"
        )
    return {**FIELDS, **(fields or {})}


# -- out ---------------------------------------------------------------------------------
def export_minari(
    buffer: Rows,
    dataset_id: str,
    query_condition: QueryCondition = None,
    *,
    fields: Mapping[str, str] | None = None,
    observation_space: Any = None,
    action_space: Any = None,
    env: Any = None,
    data_format: str = "arrow",
    jpeg_encoding: bool | None = None,
    root: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    infos: bool | None = None,
    progress: Progress | None = None,
    **metadata: Any,
) -> Any:
    """Write the buffer's episodes (the tasks with a matching row, in order of their first
    row; each task's matching rows by step) as the Minari dataset ``dataset_id``; returns
    the :class:`minari.MinariDataset` (``minari.load_dataset(dataset_id)`` opens it too).

    The spaces and environment come from the arguments, else from what the first episode
    recorded (an import or a recorder); ``env``: an id, ``EnvSpec`` or env, as Minari
    takes it. ``root``: the datasets directory (default: Minari's,
    ``MINARI_DATASETS_PATH`` or ``~/.minari/datasets``); ``overwrite`` replaces a dataset
    of that id. ``infos``: export the infos (default: when the first row holds some).
    ``jpeg_encoding`` (Minari's option for image spaces, lossy): as recorded, else off.
    ``metadata``: Minari's ``algorithm_name``, ``author``, ``description``, ...
    """
    minari = _minari("exporting a Minari dataset")
    serialization = require("minari.serialization", "exporting a Minari dataset")
    paths = _fields(fields)
    storage = buffer.storage
    tasks = storage.task_ids(query_condition)
    if not tasks:
        raise InvalidArgumentError(
            f"no rows to export{'' if query_condition is None else f' where {query_condition}'}"
            "; a Minari dataset needs at least one episode"
        )
    matching = None
    if query_condition is not None:
        matching = storage.key_index(query_condition)["key"]
    episodes = _episodes(storage, tasks, paths, matching, infos)
    first = next(episodes)
    recorded = first.recorded
    if observation_space is None and "observation_space" in recorded:
        observation_space = serialization.deserialize_space(recorded["observation_space"])
    if action_space is None and "action_space" in recorded:
        action_space = serialization.deserialize_space(recorded["action_space"])
    if env is None and recorded.get("env_spec"):
        gym = require("gymnasium", "exporting a Minari dataset")
        env = gym.envs.registration.EnvSpec.from_json(recorded["env_spec"])
    if env is None and (observation_space is None or action_space is None):
        raise InvalidArgumentError(
            "the rows do not record the observation and action spaces (rows written by "
            "import_minari or EpisodeRecorder do): give observation_space= and "
            "action_space= (gymnasium spaces) or env="
        )
    if jpeg_encoding is None:
        jpeg_encoding = bool(recorded.get("jpeg_encoding", False))
    infos = bool(first.infos)
    with _datasets_root(root):
        if overwrite and dataset_id in minari.list_local_datasets():
            with contextlib.redirect_stdout(io.StringIO()):  # Minari prints what it deleted
                minari.delete_dataset(dataset_id)
        try:
            with warnings.catch_warnings():  # Minari's advice on metadata not given
                warnings.filterwarnings("ignore", category=UserWarning, module="minari")
                dataset = minari.create_dataset_from_buffers(
                    dataset_id,
                    [],
                    env=env,
                    action_space=action_space,
                    observation_space=observation_space,
                    data_format=data_format,
                    jpeg_encoding=jpeg_encoding,
                    **metadata,
                )
        except ValueError as exc:  # Minari's word for a dataset that exists, a bad id, ...
            raise InvalidArgumentError(
                f"Minari refused to create the dataset {dataset_id!r} ("
                f"{str(exc).rstrip('.')}); overwrite=True (expstore export --overwrite) "
                "replaces a dataset of that id"
            ) from exc
        episode_buffer = require("minari.data_collector", "exporting a Minari dataset")
        chunk: list[Any] = []
        steps = 0
        files = dataset.storage  # Minari's own storage (its files), not an expstore Storage
        for number, episode in enumerate(_chain(first, episodes)):
            chunk.append(episode.to_minari(number, episode_buffer.EpisodeBuffer, infos))
            steps += episode.steps
            if steps >= CHUNK_STEPS:
                files.update_episodes(chunk)
                if progress is not None:
                    progress(steps)
                chunk, steps = [], 0
        if chunk:
            files.update_episodes(chunk)
            if progress is not None:
                progress(steps)
        return minari.load_dataset(dataset_id)


def _chain(first: _Episode, rest: Iterator[_Episode]) -> Iterator[_Episode]:
    yield first
    yield from rest


class _Episode:
    """One task's rows as the parts of a Minari episode (arrays or dicts of arrays)."""

    __slots__ = (
        "actions",
        "infos",
        "observations",
        "recorded",
        "reset_info",
        "rewards",
        "steps",
        "terminations",
        "truncations",
    )

    def __init__(self, values: dict[str, list[Any]]) -> None:
        self.steps = len(values["reward"])
        final = values["next_observation"][-1]
        self.observations = _stack([*values["observation"], final])
        self.actions = _stack([_single(a) for a in values["action"]])
        self.rewards = np.asarray([0.0 if r is None else r for r in values["reward"]], float)
        self.terminations = np.asarray([bool(d) for d in values["termination"]])
        self.truncations = np.asarray([bool(_given(t, False)) for t in values["truncation"]])
        recorded = _given(values["minari"][0], None)
        self.recorded: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
        reset_info = _given(values["reset_info"][0], None)
        self.reset_info = reset_info if isinstance(reset_info, dict) else {}
        steps_info = [_given(i, None) for i in values["info"]]
        self.infos = (
            _stack([self.reset_info, *steps_info])
            if self.reset_info and all(isinstance(i, dict) for i in steps_info)
            else {}
        )

    def to_minari(self, number: int, episode_buffer: Any, infos: bool) -> Any:
        seed = self.recorded.get("seed")
        return episode_buffer(
            id=number,
            seed=None if seed is None else int(seed),
            observations=self.observations,
            actions=self.actions,
            rewards=self.rewards,
            terminations=self.terminations,
            truncations=self.truncations,
            infos=self.infos if infos else None,
        )


def _episodes(
    storage: Any,
    tasks: list[str],
    paths: dict[str, str],
    matching: np.ndarray | None,
    infos: bool | None,
) -> Iterator[_Episode]:
    """The tasks' episodes in order, their rows read about CHUNK_STEPS at a time (a longer
    episode alone): each row's step fields, then the first rows' facts and the last
    rows' next observations by a second fetch of those rows only. ``infos``: read the
    infos (None: when the first row holds a reset info)."""
    per_row = ["observation", "action", "reward", "termination", "truncation"]
    ends = ["minari", "reset_info", "next_observation"]
    for keys in _key_chunks(storage, tasks):
        if matching is not None:
            keys = keys[np.isin(keys, matching)]
        if not len(keys):
            continue
        if infos is None:  # decided by the first row of the export
            first = storage.fetch_columns(keys[:1], [paths["reset_info"]], writable=False)[1]
            infos = isinstance(_given(first[0][0], None), dict)
        names = per_row + ["info"] * bool(infos)
        ids, columns = storage.fetch_columns(
            keys, ["task_id", *(paths[n] for n in names)], writable=False
        )
        task_of = columns[0]
        bounds = [0] + [i for i in range(1, len(ids)) if task_of[i] != task_of[i - 1]]
        bounds.append(len(ids))
        firsts = [int(keys[b]) for b in bounds[:-1]]
        lasts = [int(keys[b - 1]) for b in bounds[1:]]
        _, facts = storage.fetch_columns(firsts + lasts, [paths[n] for n in ends], writable=False)
        n = len(firsts)
        for e, (start, end) in enumerate(zip(bounds, bounds[1:], strict=False)):
            values = {
                name: _part(col, start, end) for name, col in zip(names, columns[1:], strict=True)
            }
            values["minari"] = [facts[0][e]]
            values["reset_info"] = [facts[1][e]]
            values["next_observation"] = [facts[2][n + e]]
            if not infos:
                values["info"] = [None] * (end - start)
            yield _Episode(values)


def _key_chunks(storage: Any, tasks: list[str]) -> Iterator[np.ndarray]:
    """The keys of the tasks' rows (task by task, each by step), in chunks of whole tasks
    of about CHUNK_STEPS rows, counted through the task index first."""
    for i in range(0, len(tasks), 256):
        group = tasks[i : i + 256]
        counts = storage.key_space(None, lambda space, g=group: space.count_by("task_id", g))
        if counts is None:  # a storage without a key space: its rows by task
            for task in group:
                condition = QueryBuilder().eq("task_id", task).build()
                yield _by_step(storage.key_index(condition, ["step"]))
            continue
        chunk: list[str] = []
        rows = 0
        for task in group:
            chunk.append(task)
            rows += counts.get(task, 0)
            if rows >= CHUNK_STEPS or task is group[-1]:
                yield storage.key_space(
                    None, lambda space, c=chunk: space.rows_of("task_id", c, ["step"])
                )
                chunk, rows = [], 0


def _by_step(index: dict[str, np.ndarray]) -> np.ndarray:
    return index["key"][np.argsort(index["step"], kind="stable")]


def _part(column: Any, start: int, end: int) -> list[Any]:
    part = column[start:end]
    return list(part)


def _given(value: Any, default: Any) -> Any:
    """``value``, or ``default`` where a row has nothing at the path (the fetch's MISSING)."""
    return default if value is MISSING or value is None else value


def _single(action: Any) -> Any:
    """The row's single action (TransitionConverter's reading of ``actions``)."""
    if isinstance(action, (list, tuple)) and len(action) == 1:
        return action[0]
    return action


def _stack(values: Sequence[Any]) -> Any:
    """Per-step values as one array per leaf (dicts and tuples kept as Minari keeps them)."""
    first = values[0]
    if isinstance(first, dict):
        return {k: _stack([v[k] for v in values]) for k in first}
    if isinstance(first, tuple):
        return tuple(_stack([v[i] for v in values]) for i in range(len(first)))
    if hasattr(first, "numpy") and not isinstance(first, np.ndarray):  # torch tensors
        values = [v.numpy() for v in values]
    return np.stack([np.asarray(v) for v in values])


# -- in ----------------------------------------------------------------------------------
def import_minari(
    buffer: Rows,
    dataset: Any,
    *,
    task_prefix: str | None = None,
    agent_id: str = "minari",
    root: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
) -> int:
    """Store the episodes of a Minari dataset (a :class:`minari.MinariDataset` or a
    dataset id, loaded from ``root`` or Minari's directory) as tasks
    ``<task_prefix><episode id>`` (default prefix: ``<dataset id>/``), one row per step at
    the paths of :data:`FIELDS`, the spaces recorded; returns how many steps were
    stored. Episodes are read one at a time and stored a few thousand steps per
    transaction."""
    minari = _minari("importing a Minari dataset")
    serialization = require("minari.serialization", "importing a Minari dataset")
    if isinstance(dataset, str):
        with _datasets_root(root):
            try:
                dataset = minari.load_dataset(dataset)
            except (FileNotFoundError, ValueError) as exc:
                raise InvalidArgumentError(
                    f"no Minari dataset {dataset!r} in "
                    f"{root or os.environ.get('MINARI_DATASETS_PATH', '~/.minari/datasets')}"
                    f": {exc}"
                ) from exc
    files = dataset.storage  # Minari's own storage (its files), not an expstore Storage
    meta = files.metadata
    prefix = f"{meta['dataset_id']}/" if task_prefix is None else task_prefix
    spec = dataset.spec.env_spec if hasattr(dataset, "spec") else None
    recorded = {
        "dataset_id": meta["dataset_id"],
        "observation_space": serialization.serialize_space(dataset.observation_space),
        "action_space": serialization.serialize_space(dataset.action_space),
        "env_spec": None if spec is None else spec.to_json(),
        "jpeg_encoding": bool(meta.get("jpeg_encoding", True)),
    }
    seeds = {
        int(m["id"]): m.get("seed") for m in files.get_episode_metadata(dataset.episode_indices)
    }
    stored = 0
    batch: dict[str, list[Any]] = {}
    for episode in dataset.iterate_episodes():
        seed = seeds.get(int(episode.id))
        columns = _episode_columns(episode, prefix, agent_id, {**recorded, "seed": seed})
        for name, values in columns.items():
            batch.setdefault(name, []).extend(values)
        if len(batch["step"]) >= CHUNK_STEPS // 4:
            stored += _store(buffer, batch, progress)
            batch = {}
    if batch:
        stored += _store(buffer, batch, progress)
    return stored


def _store(buffer: Rows, columns: dict[str, list[Any]], progress: Progress | None) -> int:
    stored = buffer.extend(columns)
    if progress is not None:
        progress(stored)
    return stored


def _rows_of(values: Any, n: int, offset: int = 0) -> list[Any]:
    """Per-step values (dicts and tuples of arrays kept as such) for steps offset..n+offset."""
    if isinstance(values, dict):
        per_key = {k: _rows_of(v, n, offset) for k, v in values.items()}
        return [{k: per_key[k][t] for k in per_key} for t in range(n)]
    if isinstance(values, tuple):
        parts = [_rows_of(v, n, offset) for v in values]
        return [tuple(p[t] for p in parts) for t in range(n)]
    return [values[t + offset] for t in range(n)]


def _episode_columns(
    episode: Any, prefix: str, agent_id: str, recorded: dict[str, Any]
) -> dict[str, list[Any]]:
    n = len(episode)
    infos = episode.infos or {}
    step_infos = _rows_of(infos, n, 1) if infos else [None] * n
    ext_info: list[dict[str, Any]] = []
    for t in range(n):
        info: dict[str, Any] = {"truncated": bool(episode.truncations[t])}
        if step_infos[t] is not None:
            info["info"] = step_infos[t]
        ext_info.append(info)
    ext_info[0]["minari"] = recorded
    if infos:
        ext_info[0]["reset_info"] = _rows_of(infos, 1)[0]
    return {
        "task_id": [f"{prefix}{episode.id}"] * n,
        "agent_id": [agent_id] * n,
        "step": list(range(n)),
        "state": [{"observation": o} for o in _rows_of(episode.observations, n)],
        "next_state": [{"observation": o} for o in _rows_of(episode.observations, n, 1)],
        "actions": [[a] for a in _rows_of(episode.actions, n)],
        "reward_t": [float(r) for r in episode.rewards],
        "done": [bool(d) for d in episode.terminations],
        "ext_info": ext_info,
    }
