"""AWorld's data items as expstore rows, and back, equal.

An item is whatever AWorld hands a ``Storage``: a ``Data`` (``block_id``, ``id``, ``value``,
``create_at``, ``update_at``, ``expires_at``, ``meta_info``) or any pydantic model. A
pydantic model (the item, or a ``Data``'s value) is stored as its JSON
(``model_dump(mode="json")``) with its class's import path (``module:QualName``), and is
read back by importing that class and validating the JSON: never pickled, so reading a row
runs no code but the import of the module named in it, and only a pydantic model class is
accepted from there. A ``Data`` value that is not a model (a dict, a list, text, numbers,
numpy arrays) is stored as it is.

Every row keeps, in ``exp_data.ext_info["aworld"]``: ``block`` and ``id`` (the item's block
and id), ``item`` (the item's class), ``value`` (the value's class, if a model), ``data``
(a ``Data``'s other fields), ``layout``. Its id is made of the block and the item id
(:func:`row_id`), so one item id in two blocks is two rows, as in AWorld.

Two layouts place the rest:

:class:`ItemLayout` (:class:`~expstore.integrations.aworld.ExpstoreStorage`'s), for any item:

=================================  ==============================================
row field                          from
=================================  ==============================================
``exp_meta.task_id``               the block id
``exp_meta.agent_id``              ``"aworld"``
``exp_meta.step``                  the item's position in its block (kept when the
                                   item is overwritten, as AWorld keeps it)
``exp_meta.execute_time``          a ``Data``'s ``create_at``, else the time stored
``exp_data.state``                 the value's JSON (a ``Data``'s value, or the item)
=================================  ==============================================

A condition's field ``f`` is ``exp_data.state.f``.

:class:`TrajectoryLayout` (:class:`~expstore.integrations.aworld.ExpstoreTrajectoryStorage`'s):
a ``Data`` whose value is an ``aworld.dataset.types.TrajectoryItem`` is an ordinary
trajectory row (anything else as in ItemLayout):

=================================  ==============================================
row field                          TrajectoryItem field
=================================  ==============================================
``exp_meta.task_id``               ``meta.task_id`` (the block id instead when the
                                   block is not ``trajectory_<task_id>``)
``exp_meta.task_name``             ``meta.task_name`` (``""`` for None)
``exp_meta.agent_id``              ``meta.agent_id`` (``"aworld"`` for None)
``exp_meta.step``                  ``meta.step`` (0 for None)
``exp_meta.execute_time``          ``meta.execute_time`` (the Data's ``create_at``
                                   for None)
``exp_meta.pre_agent``             ``meta.pre_agent``
``exp_data.messages``              ``state.messages`` (chat messages)
``exp_data.state``                 ``{"input": state.input, "context": state.context}``
``exp_data.actions``               ``action.tool_calls``
``exp_data.done``                  ``action.is_agent_finished``
``exp_data.reward_t``              ``reward.score``
``ext_info.aworld.session_id``     ``meta.session_id``
``ext_info.aworld.item_id``        ``id``
``ext_info.aworld.content``        ``action.content``
``ext_info.aworld.action_ext_info`` ``action.ext_info``
``ext_info.aworld.tool_outputs``   ``reward.tool_outputs``
``ext_info.aworld.status``         ``reward.status``
``ext_info.aworld.meta``           the ``meta`` fields a column does not hold as they
                                   are (a None, a task id that is not the block's)
=================================  ==============================================

Conditions name TrajectoryItem fields with dots (``meta.task_id``, ``reward.score``,
``meta.session_id``, ``state.input.content``), each read where the table puts it: the
columns' with their indexes. Rows of a block come back ordered by step, then time
(``get_by_task_id``'s order), which for one agent is the order AWorld wrote them.
"""

from __future__ import annotations

import functools
import importlib
import json
import math
import threading
import time
from collections.abc import Sequence
from hashlib import sha256
from typing import Any, ClassVar

from pydantic import BaseModel, ValidationError
from pydantic_core import to_jsonable_python

from ...errors import CodecError, QueryError
from ...model.rows import DataRow, Experience, ExpMeta, trusted_many
from ...storage.reader import collector_paused

__all__ = [
    "AGENT",
    "KEY",
    "ItemLayout",
    "TrajectoryLayout",
    "block_of",
    "item_id",
    "load_type",
    "row_id",
    "type_path",
]

#: The key of ``exp_data.ext_info`` that holds what AWorld's item needs beside the row.
KEY = "aworld"
#: The agent id of rows whose item names none.
AGENT = "aworld"
_MAX_ID = 255


def type_path(cls: type) -> str:
    """``module:QualName`` of a class, what :func:`load_type` imports back."""
    return f"{cls.__module__}:{cls.__qualname__}"


@functools.lru_cache(maxsize=1024)
def load_type(path: str) -> type[BaseModel]:
    """The pydantic model class ``module:QualName`` names; CodecError if there is none."""
    module_name, _, qualname = path.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise CodecError(
            f"a stored AWorld item is a {path}, which cannot be imported here ({exc}); "
            "import or install the module that defines it before reading the row"
        ) from exc
    if not (isinstance(found, type) and issubclass(found, BaseModel)):
        raise CodecError(
            f"a stored AWorld item names {path} as its class, which is not a pydantic model; "
            "only pydantic models are rebuilt from rows"
        )
    return found


def item_id(item: Any) -> str:
    """The id AWorld keys an item by: its ``id``, else ``str(item)``."""
    return str(item.id if hasattr(item, "id") else item)


def block_of(item: Any, block_id: Any) -> str:
    """The block AWorld files an item under: its own ``block_id``, else the one given
    (``str(None)`` when neither is: ``"None"``, as AWorld's in-memory store has it)."""
    own = getattr(item, "block_id", None)
    return str(own if own else block_id)


def row_id(block: str, data_id: str) -> str:
    """The row id of item ``data_id`` of ``block``: unambiguous, at most 255 characters."""
    made = f"{len(block)}:{block}:{data_id}"
    if len(made) <= _MAX_ID:
        return made
    return "sha256:" + sha256(made.encode("utf-8", "surrogatepass")).hexdigest()


def _is_data(item: Any) -> bool:
    from aworld.core.storage.data import Data  # the storage module imported it already

    return isinstance(item, Data)


def _json(model: BaseModel) -> Any:
    return model.model_dump(mode="json")


def _rebuild(path: str | None, stored: Any) -> Any:
    """The model ``path`` names from its JSON (as ``model_dump(mode="json")`` gave it)."""
    if path is None:
        return stored
    cls = load_type(path)
    try:
        return cls.model_validate(stored)  # JSON's values, which lax validation takes
    except ValidationError:  # a strict field (a datetime, bytes...) takes its JSON text
        return cls.model_validate_json(json.dumps(stored))


class _Positions:
    """Positions of new items: increasing in this process, and across processes in the
    order of the clock (microseconds since the epoch)."""

    def __init__(self) -> None:
        self._last = 0
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            self._last = max(self._last + 1, time.time_ns() // 1000)
            return self._last


class ItemLayout:
    """Any item as a row of its block (see the module's docstring)."""

    name: ClassVar[str] = "item"
    #: Whether :meth:`row` needs the position the item had before it was overwritten.
    keeps_position: ClassVar[bool] = True
    positions: ClassVar[_Positions] = _Positions()

    # -- items to rows ------------------------------------------------------------------
    def row(self, item: Any, block: str, position: int | None) -> DataRow:
        """``item`` of ``block`` as a row (``position``: the one it keeps, None if new)."""
        return self._item_row(item, block, position)

    def _base(self, item: Any, block: str, layout: str) -> dict[str, Any]:
        data = _is_data(item)
        value = item.value if data else item
        envelope = None
        if data:
            envelope = {
                name: to_jsonable_python(getattr(item, name))
                for name in type(item).model_fields
                if name not in ("id", "value")
            }
        return {
            "layout": layout,
            "block": block,
            "id": item_id(item),
            "item": type_path(type(item)) if isinstance(item, BaseModel) else None,
            "value": type_path(type(value)) if isinstance(value, BaseModel) else None,
            "data": envelope,
        }

    def _item_row(self, item: Any, block: str, position: int | None) -> DataRow:
        info = self._base(item, block, "item")
        value = item.value if info["data"] is not None else item
        created = getattr(item, "create_at", None) if info["data"] is not None else None
        return DataRow(
            id=row_id(block, info["id"]),
            exp_meta=ExpMeta(
                task_id=block,
                agent_id=AGENT,
                step=self.positions.next() if position is None else position,
                execute_time=_finite(created),
            ),
            exp_data=Experience(
                state=_json(value) if isinstance(value, BaseModel) else value,
                ext_info={KEY: info},
            ),
        )

    # -- rows to items ------------------------------------------------------------------
    def item(self, row: DataRow) -> Any:
        """The item ``row`` holds, of its own class, equal to the one stored."""
        return self.items([row])[0]

    def items(self, rows: Sequence[DataRow]) -> list[Any]:
        """The items ``rows`` hold (:meth:`item` of each), the models of a class made
        together, with Python's cyclic garbage collector paused (a long trajectory is
        thousands of small objects)."""
        infos = [row.exp_data.ext_info[KEY] for row in rows]
        with collector_paused():
            values = self._values(rows, infos)
            # As it was stored (every field, from a valid Data), without validation:
            # AWorld's Data declares block_id a str whose default is None, which
            # validation refuses.
            enveloped: dict[str, list[int]] = {}
            for at, info in enumerate(infos):
                if info["data"] is not None:
                    enveloped.setdefault(info["item"], []).append(at)
            for path, places in enveloped.items():
                fields = [
                    {**infos[i]["data"], "id": infos[i]["id"], "value": values[i]} for i in places
                ]
                for at, made in zip(places, _trusted(load_type(path), fields), strict=True):
                    values[at] = made
        return values

    def _values(self, rows: Sequence[DataRow], infos: list[dict[str, Any]]) -> list[Any]:
        """The values the rows hold (a Data's value, or the item itself)."""
        values: list[Any] = [None] * len(rows)
        trajectories: list[int] = []
        for at, (row, info) in enumerate(zip(rows, infos, strict=True)):
            if info["layout"] == "item":
                values[at] = _rebuild(info["value"], row.exp_data.state)
            else:
                trajectories.append(at)
        if trajectories:
            chosen = [rows[i] for i in trajectories]
            made = self._trajectory_values(chosen, [infos[i] for i in trajectories])
            for at, value in zip(trajectories, made, strict=True):
                values[at] = value
        return values

    def _trajectory_values(
        self, rows: Sequence[DataRow], infos: Sequence[dict[str, Any]]
    ) -> list[Any]:
        raise CodecError(
            f"row {rows[0].id!r} holds an AWorld TrajectoryItem; read it through "
            "ExpstoreTrajectoryStorage (or TrajectoryLayout)"
        )

    # -- blocks and fields --------------------------------------------------------------
    def block_tasks(self, block: str) -> list[str]:
        """The task ids the rows of ``block`` may have."""
        return [block]

    def field_path(self, name: str) -> str:
        """Where the field ``name`` of an item's value lives in the row."""
        return "exp_data.state." + name


class TrajectoryLayout(ItemLayout):
    """TrajectoryItems as ordinary trajectory rows (see the module's docstring)."""

    name: ClassVar[str] = "trajectory"
    keeps_position: ClassVar[bool] = False
    #: Block ids AWorld's TrajectoryDataset gives a task's steps: ``trajectory_<task id>``.
    BLOCK_PREFIX: ClassVar[str] = "trajectory_"
    _FIELDS: ClassVar[dict[str, str]] = {
        "id": f"exp_data.ext_info.{KEY}.item_id",
        "meta.session_id": f"exp_data.ext_info.{KEY}.session_id",
        "meta.task_id": "exp_meta.task_id",
        "meta.task_name": "exp_meta.task_name",
        "meta.agent_id": "exp_meta.agent_id",
        "meta.step": "exp_meta.step",
        "meta.execute_time": "exp_meta.execute_time",
        "meta.pre_agent": "exp_meta.pre_agent",
        "state.input": "exp_data.state.input",
        "state.context": "exp_data.state.context",
        "state.messages": "exp_data.messages",
        "action.content": f"exp_data.ext_info.{KEY}.content",
        "action.tool_calls": "exp_data.actions",
        "action.is_agent_finished": "exp_data.done",
        "action.ext_info": f"exp_data.ext_info.{KEY}.action_ext_info",
        "reward.tool_outputs": f"exp_data.ext_info.{KEY}.tool_outputs",
        "reward.status": f"exp_data.ext_info.{KEY}.status",
        "reward.score": "exp_data.reward_t",
    }
    #: meta fields held by a column, and what the column holds for None.
    _META_COLUMNS: ClassVar[dict[str, Any]] = {
        "task_name": "",
        "agent_id": AGENT,
        "step": 0,
        "execute_time": None,
        "pre_agent": None,
    }

    def row(self, item: Any, block: str, position: int | None) -> DataRow:
        from aworld.dataset.types import TrajectoryItem

        if not (_is_data(item) and isinstance(item.value, TrajectoryItem)):
            return self._item_row(item, block, position)
        info = self._base(item, block, "trajectory")
        dumped = _json(item.value)
        meta, state, action, reward = (dumped[k] for k in ("meta", "state", "action", "reward"))
        kept: dict[str, Any] = {}  # meta fields the columns do not hold as they are
        task = meta["task_id"]
        if not task or task not in self.block_tasks(block):
            kept["task_id"], task = task, block
        columns: dict[str, Any] = {}
        for name, instead in self._META_COLUMNS.items():
            value = meta[name]
            if value is None and instead is not None:
                kept[name] = None
                value = instead
            columns[name] = value
        if columns["execute_time"] is None:
            kept["execute_time"] = None
            columns["execute_time"] = _finite(getattr(item, "create_at", None))
        info.update(
            session_id=meta["session_id"],
            item_id=dumped["id"],
            content=action["content"],
            action_ext_info=action["ext_info"],
            tool_outputs=reward["tool_outputs"],
            status=reward["status"],
            meta=kept,
        )
        return DataRow(
            id=row_id(block, info["id"]),
            exp_meta=ExpMeta(task_id=task, **columns),
            exp_data=Experience(
                state={"input": state["input"], "context": state["context"]},
                messages=state["messages"],
                actions=action["tool_calls"],
                done=action["is_agent_finished"],
                reward_t=reward["score"],
                ext_info={KEY: info},
            ),
        )

    def _trajectory_values(
        self, rows: Sequence[DataRow], infos: Sequence[dict[str, Any]]
    ) -> list[Any]:
        items = [self._trajectory_json(row, info) for row, info in zip(rows, infos, strict=True)]
        out: list[Any] = [None] * len(items)
        plain = [at for at, info in enumerate(infos) if info["value"] == _TRAJECTORY_ITEM]
        for at, info in enumerate(infos):
            if info["value"] != _TRAJECTORY_ITEM:
                out[at] = _rebuild(info["value"], items[at])
        if not plain:
            return out
        from aworld.dataset import types

        # A TrajectoryItem's fields are all JSON's own types (str, numbers, lists, dicts,
        # Any): its JSON is its value, every field present, so it is rebuilt without
        # validating it again (a fraction of the time, for get_data_items of a long task),
        # each part's models made together.
        chosen = [items[at] for at in plain]
        parts = {
            name: _trusted(cls, [item[name] for item in chosen])
            for name, cls in (
                ("meta", types.ExpMeta),
                ("state", types.TrajectoryState),
                ("action", types.TrajectoryAction),
                ("reward", types.TrajectoryReward),
            )
        }
        whole = [
            {"id": item["id"], **{name: made[i] for name, made in parts.items()}}
            for i, item in enumerate(chosen)
        ]
        for at, made in zip(plain, _trusted(types.TrajectoryItem, whole), strict=True):
            out[at] = made
        return out

    def _trajectory_json(self, row: DataRow, info: dict[str, Any]) -> dict[str, Any]:
        """The TrajectoryItem's JSON (``model_dump(mode="json")``) the row holds."""
        meta_row, data = row.exp_meta, row.exp_data
        meta = {
            "session_id": info["session_id"],
            "task_id": meta_row.task_id,
            **{name: getattr(meta_row, name) for name in self._META_COLUMNS},
            **info["meta"],
        }
        return {
            "id": info["item_id"],
            "meta": meta,
            "state": {**data.state, "messages": data.messages},
            "action": {
                "content": info["content"],
                "tool_calls": data.actions,
                "is_agent_finished": data.done,
                "ext_info": info["action_ext_info"],
            },
            "reward": {
                "tool_outputs": info["tool_outputs"],
                "status": info["status"],
                "score": data.reward_t,
            },
        }

    def block_tasks(self, block: str) -> list[str]:
        if block.startswith(self.BLOCK_PREFIX) and len(block) > len(self.BLOCK_PREFIX):
            return [block[len(self.BLOCK_PREFIX) :], block]
        return [block]

    def field_path(self, name: str) -> str:
        found = self._FIELDS.get(name)
        if found is not None:
            return found
        head, dot, rest = name.rpartition(".")
        while head:
            prefix = self._FIELDS.get(head)
            if prefix is not None and prefix.startswith(("exp_data.state", "exp_data.ext")):
                return f"{prefix}.{rest}"
            head, dot, more = head.rpartition(".")
            rest = f"{more}.{rest}"
        raise QueryError(
            f"a TrajectoryItem has no field {name!r} that a condition can compare; name one "
            f"of {', '.join(sorted(self._FIELDS))} (or a key inside state.input, "
            "state.context, action.ext_info)"
        )


#: The class path of AWorld's TrajectoryItem, as rows record it.
_TRAJECTORY_ITEM = "aworld.dataset.types:TrajectoryItem"


def _trusted(cls: type[BaseModel], values: list[dict[str, Any]]) -> list[Any]:
    """``cls`` holding each of ``values`` (every field, valid when stored), not validated
    again, made together; validated where the fields are not exactly ``cls``'s (a row
    another version wrote)."""
    names = _field_names(cls)
    exact = [at for at, v in enumerate(values) if v.keys() == names]
    if len(exact) == len(values):
        return trusted_many(cls, values)
    out: list[Any] = [None] * len(values)
    for at, made in zip(exact, trusted_many(cls, [values[at] for at in exact]), strict=True):
        out[at] = made
    for at in set(range(len(values))).difference(exact):
        out[at] = cls.model_validate(values[at])
    return out


@functools.lru_cache(maxsize=256)
def _field_names(cls: type[BaseModel]) -> frozenset[str]:
    return frozenset(cls.model_fields)


def _finite(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return time.time()
