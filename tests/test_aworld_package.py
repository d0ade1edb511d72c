"""AWorld 0.2.7's own replay-buffer code, from its published wheel, runs on expstore's storage.

AWorld's ``ReplayBuffer``, ``RandomTaskSample``, ``DefaultConverter``, ``QueryBuilder`` and
``QueryFilter`` are imported from the installed ``aworld`` package, unmodified, and driven
against :class:`expstore.integrations.aworld_replay.AWorldSqlStorage` (SqlStorage with
AWorld's names) on SQLite and Postgres.

AWorld 0.2.7 cannot be installed beside AWorld 0.3.2 (one package name), which the test
environment has for :mod:`expstore.integrations.aworld` (the ``aworld`` extra). So its
files are read from its published wheel, downloaded by the README's test command into
``.cache/aworld-0.2.7`` (``pip download --no-deps aworld==0.2.7 -d .cache/aworld-0.2.7``)
and unpacked beside it on first use; ``EXPSTORE_AWORLD_027_DIR`` names another folder.
Its declared dependencies (mcp, openai, kubernetes...) are not needed: its package
``__init__`` files are not run (``aworld/__init__.py`` may pip-install packages at import
time and ``aworld/replay_buffer/__init__.py`` imports the event buffer, which needs those
dependencies). The modules under test are imported from the wheel's own files, under the
name ``aworld`` while a test runs (AWorld 0.3.2's modules are set aside and put back
after). The one module they import that cannot load without the missing dependencies,
``aworld.core.common`` (it pulls in AWorld's LLM and memory stacks), is stood in for by a
module defining just the two pydantic models ``base.py`` imports from it.
"""

from __future__ import annotations

import importlib
import os
import random
import shutil
import sys
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer
from expstore.integrations.aworld_replay import AWorldSqlStorage

WHEELS = Path(
    os.environ.get("EXPSTORE_AWORLD_027_DIR", Path(__file__).parent.parent / ".cache/aworld-0.2.7")
)
INSTALL = f"pip download --no-deps aworld==0.2.7 -d {WHEELS}"
_PACKAGES = ("aworld", "aworld.core", "aworld.logs", "aworld.replay_buffer", "aworld.utils")


def _stand_in_common() -> types.ModuleType:
    """``aworld.core.common``'s two models that ``aworld/replay_buffer/base.py`` imports."""

    class Observation(BaseModel):
        content: Any = None

    class ActionModel(BaseModel):
        tool_name: str | None = None
        action_name: str | None = None
        params: dict[str, Any] = {}

    module = types.ModuleType("aworld.core.common")
    module.Observation = Observation  # type: ignore[attr-defined]
    module.ActionModel = ActionModel  # type: ignore[attr-defined]
    return module


@pytest.fixture(scope="module")
def aworld() -> Iterator[types.SimpleNamespace]:
    wheel = next(iter(sorted(WHEELS.glob("aworld-0.2.7-*.whl"))), None)
    if wheel is None:
        if os.environ.get("EXPSTORE_REQUIRE_AWORLD") == "1":
            pytest.fail(
                f"EXPSTORE_REQUIRE_AWORLD=1 but {WHEELS} has no AWorld 0.2.7 wheel; {INSTALL}"
            )
        pytest.skip(f"{WHEELS} has no AWorld 0.2.7 wheel; run {INSTALL}")
    unpacked = WHEELS / wheel.stem
    if not (unpacked / "aworld").is_dir():  # unpacked aside, then moved in whole
        partial = WHEELS / f".{wheel.stem}.{os.getpid()}"
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(partial)
        try:
            partial.rename(unpacked)
        except OSError:  # another process moved its copy in first
            shutil.rmtree(partial, ignore_errors=True)
    root = unpacked / "aworld"
    saved = {n: m for n, m in sys.modules.items() if n == "aworld" or n.startswith("aworld.")}
    for name in _PACKAGES:  # package objects whose __init__ files are not run
        package = types.ModuleType(name)
        package.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
        sys.modules[name] = package
    sys.modules["aworld.core.common"] = _stand_in_common()
    try:
        base = importlib.import_module("aworld.replay_buffer.base")
        query_filter = importlib.import_module("aworld.replay_buffer.query_filter")
        assert Path(base.__file__).is_relative_to(root)  # AWorld's own files, not copies
        import aworld.utils.import_package  # noqa: F401 - never imported by what is tested

        yield types.SimpleNamespace(base=base, query_filter=query_filter)
    finally:
        for name in [n for n in sys.modules if n == "aworld" or n.startswith("aworld.")]:
            del sys.modules[name]
        sys.modules.update(saved)


def _rows(tasks: int = 12, steps: int = 5) -> list[DataRow]:
    """Rows as AWorld's README builds them, with expstore's models (the import swapped)."""
    return [
        DataRow(
            exp_meta=ExpMeta(
                task_id=f"task_{t}",
                task_name="shop" if t % 3 else "search",
                agent_id=f"agent_{t % 2}",
                step=s,
                execute_time=1000.0 + t * 10 + s,
            ),
            exp_data=Experience(state={"page": s}, actions=[{"name": "click", "i": s}]),
        )
        for t in range(tasks)
        for s in range(steps)
    ]


@pytest.fixture
def storage(db_url: str, buffer_name: str) -> Iterator[AWorldSqlStorage]:
    store = AWorldSqlStorage(db_url, name=buffer_name)
    yield store
    store.close()


def test_aworlds_replay_buffer_stores_into_expstores_storage(
    aworld: types.SimpleNamespace, storage: AWorldSqlStorage
) -> None:
    buffer = aworld.base.ReplayBuffer(storage=storage)
    rows = _rows()
    buffer.store(rows[0])
    buffer.store_batch(rows[1:])
    assert storage.size() == len(rows)
    with ReplayBuffer(storage) as ours:  # and expstore reads them back as they went in
        assert [r.id for r in ours.query()] == [r.id for r in rows]
        assert ours.get(rows[7].id) == rows[7]


def test_aworlds_random_task_sample_draws_whole_tasks_from_expstore(
    aworld: types.SimpleNamespace, storage: AWorldSqlStorage
) -> None:
    buffer = aworld.base.ReplayBuffer(storage=storage)
    buffer.store_batch(_rows())
    random.seed(0)  # AWorld's sampler draws from the random module
    # AWorld's RandomTaskSample returns rows instead of task ids when the matching rows
    # are no more than batch_size (its own in-memory storage fails there too), so it is
    # asked for fewer tasks than there are rows.
    tasks = buffer.sample_task(
        sampler=aworld.base.RandomTaskSample(),
        converter=aworld.base.DefaultConverter(),
        batch_size=4,
    )
    assert len(tasks) == 4
    for rows in tasks:
        assert len({r.exp_meta.task_id for r in rows}) == 1 and len(rows) == 5
        assert [r.exp_meta.step for r in rows] == list(range(5))
    grouped = buffer.sample(sampler=aworld.base.RandomTaskSample(), batch_size=3)
    assert len(grouped) == 3 and all(len(rows) == 5 for rows in grouped.values())


def test_aworlds_query_builder_selects_what_aworlds_own_filter_selects(
    aworld: types.SimpleNamespace, storage: AWorldSqlStorage
) -> None:
    builder, query_filter = aworld.query_filter.QueryBuilder, aworld.query_filter.QueryFilter
    rows = _rows()
    storage.add_batch(rows)
    conditions = [
        builder().eq("exp_meta.task_id", "task_3").build(),
        builder().eq("exp_meta.agent_id", "agent_1").and_().gt("exp_meta.step", 2).build(),
        builder()
        .in_("exp_meta.task_id", ["task_1", "task_2"])
        .or_()
        .eq("exp_meta.step", 4)
        .build(),
        builder()
        .eq("exp_meta.task_name", "search")
        .and_()
        .nested(builder().lt("exp_meta.step", 1).or_().gte("exp_meta.step", 4))
        .build(),
        builder().ne("exp_meta.agent_id", "agent_0").and_().not_in("exp_meta.step", [0, 1]).build(),
        # (AWorld's own filter fails on is_null, which has no value: left out here.)
        builder()
        .gte("exp_meta.step", 1)
        .and_()
        .lte("exp_meta.step", 2)
        .and_()
        .eq("exp_meta.agent_id", "agent_0")
        .build(),
    ]
    for condition in conditions:
        expected = [r.id for r in query_filter(condition).filter(rows)]
        assert expected, condition
        assert [r.id for r in storage.get_all(condition)] == expected, condition
        assert storage.size(condition) == len(expected)
        page = storage.get_paginated(1, 3, condition)
        assert [r.id for r in page] == expected[:3]
    with ReplayBuffer(storage) as ours:  # and in expstore's own sampler
        condition = builder().eq("exp_meta.agent_id", "agent_1").build()
        assert {r.exp_meta.agent_id for r in ours.sample(query_condition=condition)} == {"agent_1"}


def test_expstores_buffer_runs_aworlds_samplers_and_converters(
    aworld: types.SimpleNamespace, storage: AWorldSqlStorage
) -> None:
    storage.add_batch(_rows())
    random.seed(1)
    with ReplayBuffer(storage) as buffer:
        rows = buffer.sample(
            aworld.base.RandomTaskSample(), None, aworld.base.DefaultConverter(), 3
        )
        tasks = {r.exp_meta.task_id for r in rows}
        assert len(tasks) == 3 and len(rows) == 15  # whole tasks, task by task


def test_aworlds_own_dataclass_rows_are_stored_through_their_to_dict(
    aworld: types.SimpleNamespace, storage: AWorldSqlStorage
) -> None:
    base = aworld.base
    common = sys.modules["aworld.core.common"]
    row = base.DataRow(
        exp_meta=base.ExpMeta("t1", "shop", "agent_1", 0, 1000.0, None),
        exp_data=base.Experience(
            state=common.Observation(content="page"),  # type: ignore[attr-defined]
            actions=[common.ActionModel(action_name="click")],  # type: ignore[attr-defined]
            reward_t=1.0,
        ),
    )
    base.ReplayBuffer(storage=storage).store(row)
    (back,) = storage.get_all()
    assert back.id == row.id and back.exp_meta.task_id == "t1"
    assert back.exp_data.state == {"content": "page"} and back.exp_data.reward_t == 1.0
    assert back.exp_data.actions[0]["action_name"] == "click"
