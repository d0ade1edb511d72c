"""The row lifecycle (expstore.lifecycle.hooks), on both backends: a write or a removal
runs the statements of the features the buffer uses and of no other. Each feature is
turned on in a buffer of its own and its statements counted against a plain buffer's, as
the driver sends them (expstore.db.trace)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from expstore import RateLimiter, ReplayBuffer
from expstore.db.schema import buffers
from expstore.db.trace import driver_statements
from expstore.lifecycle.hooks import (
    HOOKS,
    RemoveContext,
    RowFeature,
    WriteContext,
    register,
    registered,
    unregister,
)
from tests.helpers import make_row

#: Tables only a feature's own statements name (the state read names them in subqueries).
FEATURE_TABLES = {
    "tracking": ("expstore_tracked_paths", "expstore_changes"),
    "arrays": ("expstore_arrays", "expstore_array_refs"),
    "rate_limit": ("expstore_rate_limits", "expstore_sample_counts"),
    "task_stats": ("expstore_task_stats",),
    "tombstones": ("expstore_tombstones",),
}


def statements(buffer: ReplayBuffer) -> Any:
    return driver_statements(buffer.sql._handle.connections.engine)


def batch(step: int, n: int = 8, *, big: bool = False) -> list[Any]:
    rows = []
    for i in range(n):
        row = make_row(f"env{i}", step=step, reward=float(i))
        if big:  # stored once by digest (past the codec's external threshold)
            row.exp_data.state = {"frame": np.full((160, 160), step, np.float32)}
        rows.append(row)
    return rows


def the_write(buffer: ReplayBuffer, *, big: bool = False) -> list[str]:
    """The statements of one write of 8 rows, after a few to warm up."""
    for step in range(3):
        buffer.store_batch(batch(step, big=big))
    with statements(buffer) as seen:
        buffer.store_batch(batch(100, big=big))
    return seen


def naming(seen: list[str], tables: tuple[str, ...]) -> list[str]:
    """The statements that name one of ``tables`` outside the state read."""
    return [
        s
        for s in seen
        if any(t in s for t in tables) and not s.startswith("SELECT expstore_buffers.name")
    ]


def test_a_plain_write_is_the_state_read_the_insert_and_the_counters(
    db_url: str, buffer_name: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        seen = the_write(buffer)
    kinds = [" ".join(s.split(" ")[:2]) for s in seen]
    if db_url.startswith("sqlite"):
        assert kinds == [
            "BEGIN IMMEDIATE",
            "SELECT expstore_buffers.name,",
            "INSERT INTO",
            "UPDATE expstore_buffers",
            "COMMIT",
        ]
    else:  # the counters in the insert's WITH clause: one round trip for both
        assert kinds == ["BEGIN", "SELECT expstore_buffers.name,", "WITH counted", "COMMIT"]
        assert "UPDATE expstore_buffers" in seen[2] and "INSERT INTO expstore_rows" in seen[2]
    for tables in FEATURE_TABLES.values():
        assert naming(seen, tables) == []


@pytest.mark.parametrize(
    ("feature", "turn_on"),
    [
        ("tracking", lambda b: b.track_changes("exp_data.reward_t")),
        ("rate_limit", lambda b: b.set_rate_limiter(RateLimiter(min_size=1))),
        ("task_stats", lambda b: b.create_summary()),
    ],
)
def test_a_feature_turned_on_adds_its_statements_and_only_its_own(
    db_url: str, buffer_name: str, feature: str, turn_on: Callable[[ReplayBuffer], Any]
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        plain = the_write(buffer)
        turn_on(buffer)
        seen = the_write(buffer)
    assert naming(plain, FEATURE_TABLES[feature]) == []
    assert naming(seen, FEATURE_TABLES[feature]), f"{feature}: none of its statements ran"
    for other, tables in FEATURE_TABLES.items():
        if other != feature:
            assert naming(seen, tables) == [], other
    assert len(seen) > len(plain)


def test_arrays_and_eviction_run_only_in_buffers_that_have_them(
    db_url: str, buffer_name: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name + "_big") as buffer:
        seen = the_write(buffer, big=True)
        assert naming(seen, FEATURE_TABLES["arrays"])
        with statements(buffer) as removal:
            assert buffer.delete({"field": "exp_meta.step", "value": 0, "op": "eq"}) == 8
        assert naming(removal, FEATURE_TABLES["arrays"])  # references looked for, swept
        assert naming(removal, FEATURE_TABLES["tombstones"])
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        the_write(buffer)
        with statements(buffer) as removal:
            assert buffer.delete({"field": "exp_meta.step", "value": 0, "op": "eq"}) == 8
        assert naming(removal, FEATURE_TABLES["arrays"]) == []
        assert naming(removal, FEATURE_TABLES["tracking"]) == []
        assert naming(removal, FEATURE_TABLES["task_stats"]) == []
        plain = the_write(buffer)
    with ReplayBuffer(db_url, name=buffer_name + "_capped", capacity=20) as buffer:
        capped = the_write(buffer)  # 32 rows written into 20: the write evicts
        assert len(buffer) == 20
    assert not any("DELETE FROM expstore_rows" in s for s in plain)
    assert any("DELETE FROM expstore_rows" in s for s in capped)


def test_every_feature_registers_once_with_the_hooks_it_has() -> None:
    names = [f.name for f in registered()]
    assert names == ["rate_limit", "tombstones", "task_stats", "arrays", "tracking", "retention"]
    for feature in registered():
        own = {h for h in HOOKS if getattr(type(feature), h) is not getattr(RowFeature, h)}
        assert own, f"{feature.name} has no hook"
    by_name = {f.name: f for f in registered()}
    assert {
        h for h in HOOKS if getattr(type(by_name["retention"]), h) is not getattr(RowFeature, h)
    } == {"after_write"}


class _Audit(RowFeature):
    """A feature of the test's own: it keeps, in Python, what each hook saw, for buffers
    whose capacity is 30 (its setting: None for every other buffer)."""

    name = "test_audit"
    order = 60

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    def columns(self, buffer_id: Any) -> list[Any]:
        return [buffers.c.capacity]

    def setting(self, values: Any) -> Any:
        return "audited" if values[0] == 30 else None

    def after_insert(self, ctx: WriteContext, setting: Any) -> None:
        self.seen.append(("inserted", sorted(ctx.new_keys().values())))

    def before_remove(self, ctx: RemoveContext, setting: Any) -> None:
        self.seen.append((ctx.reason, list(ctx.keys)))


def test_a_feature_of_ones_own_joins_every_write_and_removal_of_the_buffers_using_it(
    db_url: str, buffer_name: str
) -> None:
    audit = _Audit()
    register(audit)
    try:
        with pytest.raises(Exception, match="registered already"):
            register(_Audit())
        with ReplayBuffer(db_url, name=buffer_name + "_other", capacity=50) as other:
            other.store_batch(batch(0))
            other.delete({"field": "exp_meta.step", "value": 0, "op": "eq"})
        assert audit.seen == []  # a buffer that does not use it: none of its hooks ran
        with ReplayBuffer(db_url, name=buffer_name, capacity=30) as buffer:
            for step in range(4):  # 32 rows into 30: the last write evicts 2
                buffer.store_batch(batch(step))
            keys = [k for kind, ks in audit.seen if kind == "inserted" for k in ks]
            assert len(keys) == 32 and keys == sorted(keys)
            assert [(kind, len(ks)) for kind, ks in audit.seen[-2:]] == [
                ("inserted", 8),
                ("capacity", 2),
            ]
            assert audit.seen[-1][1] == keys[:2]  # the oldest two went
    finally:
        unregister("test_audit")
    assert "test_audit" not in [f.name for f in registered()]
    with pytest.raises(Exception, match="no row feature"):
        unregister("test_audit")
