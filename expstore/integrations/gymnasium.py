"""Recording a Gymnasium environment's steps into a buffer, as episodes.

>>> env = EpisodeRecorder(gym.make("CartPole-v1"), buffer)
>>> obs, info = env.reset(seed=0)
>>> obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
>>> env.close()                      # writes what is left

Each episode is a task (``<task_prefix><episode number>``), each step a row at the paths
:class:`~expstore.TransitionConverter` and :func:`expstore.export_minari` read: the
observation the action was taken in (``exp_data.state.observation``), the action
(``exp_data.actions``, a list of one), ``reward_t``, ``done`` (terminated), the
observation the step returned (``exp_data.next_state.observation``) and
``exp_data.ext_info.truncated``. The final observation is handled as Minari's
``DataCollector`` handles it: the observation the terminating or truncating step returned
ends the episode (the last row's next observation), and the next episode starts from the
observation of the next reset. With a vector environment (:class:`VectorEpisodeRecorder`)
the same holds for each sub-environment whichever autoreset mode it uses (next step: the
step after the end is the reset and records nothing; same step: the final observation is
``info["final_obs"]``).

The first row of an episode also keeps the spaces, the environment's spec and the reset's
seed (``exp_data.ext_info.minari``, when Minari is installed, which serialises the
spaces), so ``expstore export --format minari`` needs nothing more; with
``record_infos=True`` the reset's and the steps' infos too (``reset_info``, ``info``).

Rows are written ``flush_steps`` at a time (one transaction each), when an episode ends
(single environments) and at ``close()``; a crash loses at most the unwritten steps.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from .._optional import require
from ..buffer import ReplayBuffer

gym: Any = require("gymnasium", "expstore.integrations.gymnasium")

__all__ = ["EpisodeRecorder", "VectorEpisodeRecorder"]


def _recorded(env: Any, seed: int | None) -> dict[str, Any]:
    """What the first row of an episode keeps of its environment (see the module)."""
    facts: dict[str, Any] = {"seed": seed}
    try:
        serialization = require("minari.serialization", "recording spaces")
    except ImportError:
        return facts
    single_obs = getattr(env, "single_observation_space", env.observation_space)
    single_act = getattr(env, "single_action_space", env.action_space)
    facts["observation_space"] = serialization.serialize_space(single_obs)
    facts["action_space"] = serialization.serialize_space(single_act)
    facts["env_spec"] = _spec_json(getattr(env, "spec", None))
    return facts


def _spec_json(spec: Any) -> str | None:
    """The env's spec as Gymnasium's JSON; a vector env's (whose vector options JSON cannot
    hold) as its registered id's; None when neither is there."""
    for candidate in (spec, None if spec is None else gym.spec(spec.id)):
        if candidate is None:
            continue
        try:
            return str(candidate.to_json())
        except (TypeError, ValueError, gym.error.Error):
            continue
    return None


class _Steps:
    """The steps recorded and not yet written, as extend's columns."""

    def __init__(self, buffer: ReplayBuffer, agent_id: str, flush_steps: int) -> None:
        self.buffer, self.agent_id, self.flush_steps = buffer, agent_id, flush_steps
        self.rows: list[tuple[str, int, Any, Any, float, bool, Any, dict[str, Any]]] = []
        self.written = 0

    def add(
        self,
        task: str,
        step: int,
        obs: Any,
        action: Any,
        reward: float,
        terminated: bool,
        next_obs: Any,
        ext_info: dict[str, Any],
    ) -> None:
        self.rows.append((task, step, obs, action, reward, terminated, next_obs, ext_info))
        if len(self.rows) >= self.flush_steps:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        tasks, steps, obs, actions, rewards, dones, next_obs, ext = zip(*self.rows, strict=True)
        self.rows = []
        self.written += self.buffer.extend(
            {
                "task_id": list(tasks),
                "agent_id": self.agent_id,
                "step": list(steps),
                "state": [{"observation": o} for o in obs],
                "actions": [[a] for a in actions],
                "reward_t": [float(r) for r in rewards],
                "done": [bool(d) for d in dones],
                "next_state": [{"observation": o} for o in next_obs],
                "ext_info": list(ext),
            }
        )


def _prefix(env: Any, task_prefix: str | None) -> str:
    if task_prefix is not None:
        return task_prefix
    spec = getattr(env, "spec", None)
    name = spec.id if spec is not None else type(env.unwrapped).__name__
    return f"{name}/{uuid.uuid4().hex[:8]}-{os.getpid()}/"


class EpisodeRecorder(gym.Wrapper):  # type: ignore[misc]
    """A Gymnasium wrapper that records every step of ``env`` into ``buffer`` (see the
    module): ``EpisodeRecorder(env, buffer, *, task_prefix=None, agent_id="gymnasium",
    record_infos=False, flush_steps=256)``; ``steps_written`` counts the rows stored."""

    def __init__(
        self,
        env: Any,
        buffer: ReplayBuffer,
        *,
        task_prefix: str | None = None,
        agent_id: str = "gymnasium",
        record_infos: bool = False,
        flush_steps: int = 256,
    ) -> None:
        super().__init__(env)
        self._steps = _Steps(buffer, agent_id, flush_steps)
        self._prefix = _prefix(env, task_prefix)
        self._record_infos = record_infos
        self._episode = -1
        self._step = 0
        self._obs: Any = None
        self._first: dict[str, Any] = {}

    @property
    def steps_written(self) -> int:
        return self._steps.written

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self._steps.flush()
        obs, info = self.env.reset(seed=seed, options=options)
        self._episode += 1
        self._step = 0
        self._obs = obs
        self._first = {"minari": _recorded(self.env, seed)}
        if self._record_infos:
            self._first["reset_info"] = info
        return obs, info

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        ext: dict[str, Any] = {"truncated": bool(truncated)}
        if self._record_infos:
            ext["info"] = info
        if self._step == 0:
            ext.update(self._first)
        task = f"{self._prefix}{self._episode}"
        self._steps.add(
            task, self._step, self._obs, action, float(reward), bool(terminated), obs, ext
        )
        self._step += 1
        self._obs = obs
        if terminated or truncated:
            self._steps.flush()
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        self._steps.flush()
        super().close()


class VectorEpisodeRecorder(gym.vector.VectorWrapper):  # type: ignore[misc]
    """:class:`EpisodeRecorder` for a Gymnasium vector environment: each sub-environment's
    episodes are tasks of their own; both autoreset modes (next step, same step) are
    followed. Infos are not recorded (a vector env's infos are batched dicts)."""

    def __init__(
        self,
        env: Any,
        buffer: ReplayBuffer,
        *,
        task_prefix: str | None = None,
        agent_id: str = "gymnasium",
        flush_steps: int = 256,
    ) -> None:
        super().__init__(env)
        self._steps = _Steps(buffer, agent_id, flush_steps)
        self._prefix = _prefix(env, task_prefix)
        mode = env.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
        self._same_step = mode == gym.vector.AutoresetMode.SAME_STEP
        if mode == gym.vector.AutoresetMode.DISABLED:
            self._same_step = False
        self._episodes = 0
        self._episode: list[int] = []
        self._step: list[int] = []
        self._ended: list[bool] = []
        self._obs: Any = None
        self._facts: dict[str, Any] = {}

    @property
    def steps_written(self) -> int:
        return self._steps.written

    def _start(self, i: int) -> None:
        self._episode[i] = self._episodes
        self._episodes += 1
        self._step[i] = 0
        self._ended[i] = False

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> Any:
        self._steps.flush()
        obs, info = self.env.reset(seed=seed, options=options)
        n = self.env.num_envs
        self._episode, self._step, self._ended = [0] * n, [0] * n, [False] * n
        for i in range(n):
            self._start(i)
        self._obs = obs
        self._facts = _recorded(self.env, seed if isinstance(seed, int) else None)
        return obs, info

    def step(self, actions: Any) -> Any:
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        final = info.get("final_obs") if self._same_step else None
        for i in range(self.env.num_envs):
            if self._ended[i]:  # next-step autoreset: this step was env i's reset
                self._start(i)
                continue
            ended = bool(terminated[i] or truncated[i])
            next_obs = final[i] if (final is not None and ended) else _row(obs, i)
            ext: dict[str, Any] = {"truncated": bool(truncated[i])}
            if self._step[i] == 0:
                ext["minari"] = self._facts
            self._steps.add(
                f"{self._prefix}{self._episode[i]}",
                self._step[i],
                _row(self._obs, i),
                _row(actions, i),
                float(rewards[i]),
                bool(terminated[i]),
                next_obs,
                ext,
            )
            self._step[i] += 1
            if ended:
                if self._same_step:  # obs[i] is already the next episode's first
                    self._start(i)
                else:
                    self._ended[i] = True
        self._obs = obs
        return obs, rewards, terminated, truncated, info

    def close(self, **kwargs: Any) -> None:
        self._steps.flush()
        super().close(**kwargs)


def _row(batch: Any, i: int) -> Any:
    """Sub-environment ``i``'s part of a batched value (dicts and tuples of arrays too)."""
    if isinstance(batch, dict):
        return {k: _row(v, i) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_row(v, i) for v in batch)
    return batch[i]
