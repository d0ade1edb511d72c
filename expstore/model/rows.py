"""The row model: ``DataRow = ExpMeta + Experience``, as in AWorld's replay buffer.

Metadata (``ExpMeta`` plus ``reward_t``, ``adv_t``, ``v_t`` and ``done``) is stored in typed,
indexed columns (:mod:`expstore.model.layout` reads which from these models); the rest of the
experience (``state``, ``actions``, ``messages``, ``next_state``, ``ext_info``) is stored as
JSON plus tensor bytes by :mod:`expstore.codec`.
Those free-form fields take any JSON value, pydantic models (stored as their dump, so they
come back as dicts), numpy arrays and torch tensors, nested at any depth.
"""

from __future__ import annotations

import math
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from functools import partial
from itertools import repeat
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..codec import check_value, deep_equal, text_problem, to_plain
from ..errors import InvalidArgumentError

__all__ = ["DataRow", "ExpMeta", "Experience", "trusted_many"]

_M = TypeVar("_M", bound=BaseModel)
#: Marks a column that gets a ``(buffer_id, column)`` index (see :mod:`expstore.model.layout`).
_INDEXED: dict[str, Any] = {"indexed": True}


def _storable_text(value: str) -> str:
    """``value`` if a database can store it; the ValueError that says why not otherwise."""
    problem = text_problem(value)
    if problem:
        raise InvalidArgumentError(problem)
    return value


class ExpMeta(BaseModel):
    """Who produced a row and when: task, agent, step and time.

    >>> ExpMeta(task_id="t1", agent_id="a1", step=0).task_name
    ''
    """

    model_config = ConfigDict(extra="forbid")

    task_id: str = Field(min_length=1, max_length=255)
    task_name: str = ""
    agent_id: str = Field(min_length=1, max_length=255, json_schema_extra=_INDEXED)
    step: int = Field(ge=0, le=2**63 - 1)
    execute_time: float = Field(default_factory=time.time)
    pre_agent: str | None = Field(default=None, max_length=255)
    #: The version of the policy that produced the row (the trainer's step, say); see
    #: :meth:`expstore.ReplayBuffer.set_policy_version` and ``max_staleness``.
    policy_version: int | None = Field(default=None, ge=0, le=2**63 - 1, json_schema_extra=_INDEXED)
    #: A row generated over several policy versions (a rollout interrupted by weight
    #: updates and continued, slime's ``weight_versions``): the versions of its oldest
    #: and newest segments. ``policy_version`` is what staleness and ``max_staleness``
    #: count; it defaults to ``oldest_version`` (the oldest segment counts), and may be set
    #: to ``newest_version`` to count the newest instead.
    oldest_version: int | None = Field(default=None, ge=0, le=2**63 - 1)
    newest_version: int | None = Field(default=None, ge=0, le=2**63 - 1)

    @model_validator(mode="after")
    def _segments(self) -> ExpMeta:
        oldest, newest = self.oldest_version, self.newest_version
        if oldest is None and newest is None:
            return self
        if oldest is None or newest is None or oldest > newest:
            raise InvalidArgumentError(
                "oldest_version and newest_version go together, oldest <= newest (the "
                f"versions of a row's first and last segments); got {oldest} and {newest}"
            )
        if self.policy_version is None:
            object.__setattr__(self, "policy_version", oldest)  # the oldest segment counts
        elif self.policy_version not in (oldest, newest):
            raise InvalidArgumentError(
                f"policy_version {self.policy_version} of a row generated over versions "
                f"{oldest}..{newest} counts its oldest segment ({oldest}, the default) or its "
                f"newest ({newest}); set one of those, or leave it out"
            )
        return self

    @field_validator("task_id", "task_name", "agent_id", "pre_agent")
    @classmethod
    def _storable(cls, value: str | None) -> str | None:
        return value if value is None else _storable_text(value)

    @field_validator("execute_time")
    @classmethod
    def _finite_time(cls, value: float) -> float:
        if not math.isfinite(value):
            raise InvalidArgumentError(
                f"execute_time must be a finite number of seconds, got {value!r}"
            )
        return value


class Experience(BaseModel):
    """What happened at one step: state, actions, reward and the rest.

    ``action=`` (singular, as in AWorld's README) is accepted and stored as ``actions=[action]``.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    state: Any = None
    actions: Any = Field(default_factory=list)
    reward_t: float | None = Field(default=None, json_schema_extra=_INDEXED)
    adv_t: float | None = None
    v_t: float | None = None
    messages: list[dict[str, Any]] | None = None
    done: bool = False
    next_state: Any = None
    ext_info: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _singular_action(cls, data: Any) -> Any:
        if isinstance(data, dict) and "action" in data:
            if "actions" in data:
                raise InvalidArgumentError("give either action= or actions=, not both")
            data = dict(data)
            data["actions"] = [data.pop("action")]
        return data

    @field_validator("reward_t", "adv_t", "v_t")
    @classmethod
    def _finite_scalar(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise InvalidArgumentError(
                f"must be a finite number or None, got {value!r}; "
                "store non-finite values in ext_info instead"
            )
        return value

    @field_validator("state", "actions", "messages", "next_state", "ext_info")
    @classmethod
    def _storable(cls, value: Any, info: Any) -> Any:
        check_value(value, info.field_name)
        return value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Experience):
            return NotImplemented
        return all(
            deep_equal(getattr(self, name), getattr(other, name))
            for name in type(self).model_fields
        )

    __hash__ = None  # type: ignore[assignment]


class DataRow(BaseModel):
    """One stored experience: metadata, data and a unique id (a uuid4 string by default)."""

    model_config = ConfigDict(extra="forbid")

    exp_meta: ExpMeta
    exp_data: Experience
    id: str = Field(default_factory=lambda: str(uuid.uuid4()), min_length=1, max_length=255)

    @field_validator("id")
    @classmethod
    def _storable(cls, value: str) -> str:
        return _storable_text(value)

    def to_dict(self) -> dict[str, Any]:
        """The row as plain Python: pydantic models become dicts, tensors stay tensors."""
        return {
            "exp_meta": self.exp_meta.model_dump(),
            "exp_data": {
                name: to_plain(getattr(self.exp_data, name))
                for name in type(self.exp_data).model_fields
            },
            "id": self.id,
        }


def trusted_many(cls: type[_M], values: Iterable[dict[str, Any]]) -> list[_M]:
    """Build ``cls`` from each of ``values``, dicts of values validated when they were
    stored (each holding every field): what ``model_construct`` does, without its per-call
    overhead, each slot filled over the whole list at once, in C (a reader builds three
    models per row, hundreds of rows per batch)."""
    dicts = list(values)
    n = len(dicts)
    made = list(map(_new, repeat(cls, n)))
    _each(map(_set_dict, made, dicts))
    # Every field is set: a set of its own per object (pydantic adds to it on assignment).
    _each(map(_set_fields_set, made, map(set, repeat(_field_names(cls), n))))
    _each(map(_set_extra, made, repeat(None, n)))
    _each(map(_set_private, made, repeat(None, n)))
    return made


def _field_names(cls: type[BaseModel]) -> frozenset[str]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = frozenset(cls.model_fields)
    return names


# The slots trusted_many() fills, set through their descriptors (a third faster than
# object.__setattr__ by name; BaseModel's own __setattr__ would validate).
_new = object.__new__
_FIELD_NAMES: dict[type[Any], frozenset[str]] = {}
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__
#: Runs an iterator to its end for its effects (a deque that keeps nothing).
_each: Callable[[Iterable[Any]], object] = partial(deque, maxlen=0)
