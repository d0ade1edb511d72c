"""What the viewer's pages show, read from the database (no HTTP here).

One :class:`Viewer` per served database keeps one open handle per buffer, shared by every
request (handles are safe across threads). Everything it reads goes through the buffer's
public API (``page``, ``get``, ``get_by_task_id``, ``lineage``, ``queue_stats``,
``rate_limit_stats``, ``policy_version``), but for the live page's snapshot, which reads
typed columns only (never a payload) in one read transaction of three statements, and is
shared by every open tab for :attr:`Viewer.live_every` seconds (5 by default), so the live
page costs the database under one statement per second whatever the number of tabs.
"""

from __future__ import annotations

import json
import math
import threading
import time
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import Text, cast, exists, func, select

from ..buffer import ReplayBuffer
from ..codec.format import ESCAPED_KEY, FLOAT_KEY, TENSOR_KEY
from ..db.engine import create_sql_engine
from ..db.schema import buffers, consumption, newest_first, rate_limits, rows
from ..errors import ExpstoreError, InvalidArgumentError
from ..features.claims.reports import Lineage, claim_state
from ..model.images import AUTO_MIN_SIDE
from ..model.layout import META_COLUMNS, ORDERABLE, PAYLOAD_FIELDS, SCALAR_COLUMNS
from ..model.paths import MISSING, parse_path, read_path
from ..model.rows import DataRow
from ..query import Comparison, Condition, parse_where, to_sql
from ..storage.reader import MAX_PAGE
from ..storage.sql import describe_database

__all__ = [
    "ArrayRef",
    "Brief",
    "DEFAULT_COLUMNS",
    "MAX_ROWS_SHOWN",
    "BufferSummary",
    "GroupView",
    "NotFound",
    "RowsView",
    "TrajectoryView",
    "Viewer",
    "image_paths",
]

#: The columns of the rows table unless the page asks for others.
DEFAULT_COLUMNS = (
    "id",
    "exp_meta.task_id",
    "exp_meta.agent_id",
    "exp_meta.step",
    "exp_data.reward_t",
    "exp_meta.policy_version",
    "exp_data.state",
)
#: The most rows one page of the rows table shows (a bigger ``limit`` is refused).
MAX_ROWS_SHOWN = 500
#: Rows the live page's snapshot reads (the newest), for its plots.
LIVE_ROWS = 2000


class NotFound(ExpstoreError, LookupError):
    """A buffer, row or task the page names does not exist (HTTP 404)."""


@dataclass(frozen=True)
class BufferSummary:
    """One buffer on the buffers page."""

    name: str
    rows: int
    capacity: int | None
    eviction: str
    policy_version: int | None
    tasks: int | None
    agents: int | None
    rate_limit: str | None


@dataclass(frozen=True)
class ArrayRef:
    """An array or tensor of a row as its stored document describes it (dtype, shape), its
    bytes never read: what a table or a trajectory shows of it."""

    path: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def image(self) -> bool:
        """A uint8 array laid out as an image (HxW, HxWx1, HxWx3, HxWx4)."""
        s = self.shape
        return (
            self.dtype in ("|u1", "uint8")
            and (len(s) == 2 or (len(s) == 3 and s[2] in (1, 3, 4)))
            and min(s[:2]) >= AUTO_MIN_SIDE  # as the image route takes them
        )

    def __str__(self) -> str:
        shape = "x".join(map(str, self.shape)) or "scalar"
        dtype = {"|u1": "uint8", "|b1": "bool"}.get(self.dtype, self.dtype.lstrip("<>|="))
        return f"<{dtype} {shape}{' image' if self.image else ''}>"


@dataclass(frozen=True)
class Brief:
    """A row as the viewer's tables show it, read without a byte of its arrays: its key,
    id, typed columns (``exp_meta.*``, ``exp_data.reward_t``...) and payload fields with
    each array as an :class:`ArrayRef`."""

    key: int
    id: str
    columns: dict[str, Any]
    payload: dict[str, Any]

    def value(self, path: str) -> Any:
        """The value at a field path (MISSING where the row has nothing there)."""
        parsed = parse_path(path)
        if parsed.column is not None:
            if parsed.column.path == "id":
                return self.id
            return self.columns.get(parsed.column.path, MISSING)
        value: Any = self.payload.get(str(parsed.top), MISSING)
        for step in parsed.steps:
            if isinstance(value, dict) and str(step) in value:
                value = value[str(step)]
            elif (
                isinstance(value, list)
                and isinstance(step, int)
                and -len(value) <= step < len(value)
            ):
                value = value[step]
            else:
                return MISSING
        return value

    def images(self, under: str = "exp_data.state") -> list[str]:
        """The paths of the image arrays under ``under``."""
        return image_paths(self.value(under))[:8]


def image_paths(value: Any) -> list[str]:
    """The paths of the image arrays (:class:`ArrayRef`) in a :class:`Brief` row's value."""
    found: list[str] = []
    _image_paths(value, found)
    return found


def _image_paths(value: Any, out: list[str]) -> None:
    if isinstance(value, ArrayRef):
        if value.image:
            out.append(value.path)
    elif isinstance(value, dict):
        for v in value.values():
            _image_paths(v, out)
    elif isinstance(value, list):
        for v in value[:200]:
            _image_paths(v, out)


def _described(value: Any, path: str) -> Any:
    """A stored document's value with its placeholders read (docs/format.md): arrays as
    ArrayRefs, tagged floats as floats, escaped dicts as the dicts they are."""
    if isinstance(value, dict):
        if len(value) == 1:
            ((tag, inner),) = value.items()
            if tag == TENSOR_KEY and isinstance(inner, dict):
                shape = tuple(int(n) for n in inner.get("shape", ()))
                return ArrayRef(path, str(inner.get("dtype", "?")), shape)
            if tag == FLOAT_KEY:
                return float(inner) if isinstance(inner, (str, int, float)) else inner
            if tag == ESCAPED_KEY and isinstance(inner, dict):
                return {k: _described(v, f"{path}.{k}") for k, v in inner.items()}
        return {k: _described(v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_described(v, f"{path}.{i}") for i, v in enumerate(value)]
    return value


_BRIEF_COLUMNS = [
    rows.c.key,
    rows.c.id,
    *(rows.c[c] for c in META_COLUMNS),
    *(rows.c[c] for c in SCALAR_COLUMNS),
    cast(rows.c.data, Text).label("data"),
]
_PATHS = [
    *(f"exp_meta.{c}" for c in META_COLUMNS),
    *(f"exp_data.{c}" for c in SCALAR_COLUMNS),
]


def briefs(buffer: ReplayBuffer, keys: Sequence[int]) -> list[Brief]:
    """The rows of ``keys`` (in that order; gone ones left out) as :class:`Brief` rows:
    one statement, no array bytes."""
    if not keys:
        return []
    handle = buffer.sql.handle
    stmt = select(*_BRIEF_COLUMNS).where(handle.dialect.key_in())
    with handle.errors("read rows"), handle.read() as conn:
        found = {
            int(r.key): r for r in conn.execute(stmt, {"keys": handle.dialect.key_set(list(keys))})
        }
    out = []
    for key in keys:
        r = found.get(key)
        if r is None:
            continue
        values = list(r)
        columns = dict(zip(_PATHS, values[2 : 2 + len(_PATHS)], strict=True))
        document = json.loads(r.data) if isinstance(r.data, str) else dict(r.data or {})
        payload = {
            name: _described(document.get(name), f"exp_data.{name}") for name in PAYLOAD_FIELDS
        }
        out.append(Brief(key, str(r.id), columns, payload))
    return out


@dataclass(frozen=True)
class RowsView:
    """One page of the rows table."""

    buffer: str
    where: str
    condition: Condition | None
    columns: tuple[str, ...]
    order_by: str
    limit: int
    rows: list[Brief]
    next: str | None
    after: str | None


@dataclass(frozen=True)
class TrajectoryView:
    """A task's steps in order, and its neighbours within the filter."""

    buffer: str
    task_id: str
    where: str
    steps: list[Brief]
    previous: str | None
    next: str | None


@dataclass(frozen=True)
class GroupView:
    """A GRPO group: its completions, with advantages and claim records."""

    buffer: str
    key: str
    group_by: str
    rows: list[Brief]
    advantages: list[float | None]
    lineage: dict[str, Lineage]


@dataclass
class _Live:
    at: float = 0.0
    snapshot: dict[str, Any] = field(default_factory=dict)
    rows_then: tuple[float, int] | None = None


class Viewer:
    """The database the UI shows. ``live_every``: seconds a live snapshot is shared for
    (and how often the live page asks for one)."""

    def __init__(self, url: str, *, live_every: float = 5.0) -> None:
        self.url = url
        self.live_every = live_every
        self._buffers: dict[str, ReplayBuffer] = {}
        self._live: dict[str, _Live] = {}
        self._lock = threading.Lock()
        #: Statements the live snapshots ran (for the cost check).
        self.live_statements = 0

    # -- buffers ---------------------------------------------------------------------------
    def describe(self) -> tuple[str | None, list[Any]]:
        """The database's schema revision and buffers (rows not counted)."""
        revision, found = describe_database(self.url, count_rows=False)
        return revision, list(found or [])

    def buffer(self, name: str) -> ReplayBuffer:
        """The open handle of buffer ``name``; NotFound if the database has none."""
        with self._lock:
            known = self._buffers.get(name)
        if known is not None:
            return known
        _, found = self.describe()
        if name not in {b.name for b in found}:
            raise NotFound(f"the database has no buffer named {name!r}")
        opened = ReplayBuffer(self.url, name=name)
        with self._lock:
            kept = self._buffers.setdefault(name, opened)
        if kept is not opened:
            opened.close()
        return kept

    def overview(self) -> tuple[str | None, list[BufferSummary]]:
        """Every buffer with its rows, retention, policy version, rate limit, and tasks
        and agents when the buffer keeps task summaries (counting them otherwise would
        read every row): three statements whatever the number of buffers, and a handle
        opened only for a buffer with summaries."""
        revision, found = describe_database(self.url, count_rows=True)
        if not found:
            return revision, []
        engine = create_sql_engine(self.url)
        try:
            with engine.connect() as conn:
                limits = {
                    int(r.buffer_id): r
                    for r in conn.execute(
                        select(
                            rate_limits.c.buffer_id,
                            rate_limits.c.samples_per_insert,
                            rate_limits.c.min_size,
                            rate_limits.c.block_writers,
                        )
                    )
                }
                ids = {
                    str(n): int(i) for n, i in conn.execute(select(buffers.c.name, buffers.c.id))
                }
                summarised = set(
                    conn.execute(
                        select(buffers.c.name).where(buffers.c.summary_from.is_not(None))
                    ).scalars()
                )
        finally:
            engine.dispose()
        out = []
        for info in found:
            tasks = agents = None
            if info.name in summarised:
                summary = self.buffer(info.name).sql.summary(None, 0.0)
                tasks, agents = summary.get("tasks"), summary.get("agents")
            limit = limits.get(int(ids[info.name]))
            out.append(
                BufferSummary(
                    info.name,
                    int(info.rows or 0),
                    info.capacity,
                    info.eviction,
                    info.policy_version,
                    tasks,
                    agents,
                    None if limit is None else _limit_text(limit),
                )
            )
        return revision, out

    def close(self) -> None:
        with self._lock:
            opened, self._buffers = list(self._buffers.values()), {}
        for buffer in opened:
            buffer.close()

    # -- rows --------------------------------------------------------------------------------
    def rows(
        self,
        name: str,
        *,
        where: str = "",
        after: str | None = None,
        limit: int = 50,
        columns: Sequence[str] = (),
        order_by: str = "key",
    ) -> RowsView:
        """A page of the rows table. QueryError (with its caret) for a bad ``where``,
        InvalidArgumentError for a bad column, order, cursor or page size."""
        buffer = self.buffer(name)
        if not 1 <= limit <= MAX_ROWS_SHOWN:
            raise InvalidArgumentError(
                f"a page shows 1 to {MAX_ROWS_SHOWN} rows, not {limit}; page through with "
                "the Next link instead"
            )
        if order_by.lstrip("-") not in ORDERABLE:
            raise InvalidArgumentError(
                f"rows sort by {', '.join(ORDERABLE)} (a leading '-' for descending), not "
                f"{order_by!r}"
            )
        shown = tuple(columns) or DEFAULT_COLUMNS
        for path in shown:
            parse_path(path)  # QueryError naming the fields there are
        condition = parse_where(where) if where.strip() else None
        keys, following = buffer.sql.keys_after(
            condition, after=after or None, limit=limit, order_by=order_by
        )
        return RowsView(
            name, where, condition, shown, order_by, limit, briefs(buffer, keys), following, after
        )

    def record(self, name: str, row_id: str) -> tuple[DataRow, Lineage | None]:
        """One row and its lineage; NotFound if the buffer holds no such row."""
        buffer = self.buffer(name)
        row = buffer.get(row_id)
        if row is None:
            raise NotFound(f"buffer {name!r} holds no row with id {row_id!r}")
        return row, buffer.lineage([row_id]).get(row_id)

    def array(self, name: str, row_id: str, path: str) -> Any:
        """The value at ``path`` of a row (for an image or a preview)."""
        row, _ = self.record(name, row_id)
        value = read_path(row, parse_path(path))
        if value is MISSING:
            raise NotFound(f"row {row_id!r} has nothing at {path!r}")
        return value

    # -- trajectories and groups -------------------------------------------------------------
    def trajectory(self, name: str, task_id: str, *, where: str = "") -> TrajectoryView:
        """A task's steps in order, with the previous and next task among the rows the
        filter ``where`` matches (by each task's first row)."""
        buffer = self.buffer(name)
        condition = parse_where(where) if where.strip() else None
        mine = Comparison("task_id", "eq", task_id)
        keys, _ = buffer.sql.keys_after(mine, after=None, limit=MAX_PAGE, order_by="step")
        if not keys:
            raise NotFound(f"buffer {name!r} holds no step of task {task_id!r}")
        steps = briefs(buffer, keys)
        handle = buffer.sql.handle
        first = min(keys)
        earlier = rows.alias("earlier")
        matching = to_sql(condition, rows, handle.dialect.name)
        earlier_matching = to_sql(condition, typing.cast(Any, earlier), handle.dialect.name)
        # A row that is the first (matching) row of its task: tasks in the order of their
        # first rows, each probe a lookup in the (buffer_id, task_id, step) index.
        opens_task = ~exists(
            select(earlier.c.key).where(
                earlier.c.buffer_id == handle.buffer_id,
                earlier.c.task_id == rows.c.task_id,
                earlier.c.key < rows.c.key,
                *([] if earlier_matching is None else [earlier_matching]),
            )
        )

        def neighbour(descending: bool) -> str | None:
            side = rows.c.key < first if descending else rows.c.key > first
            stmt = (
                select(rows.c.task_id)
                .where(
                    handle.dialect.in_key_order(handle.buffer_id),
                    side,
                    rows.c.task_id != task_id,
                    opens_task,
                    *([] if matching is None else [matching]),
                )
                .order_by(
                    *(
                        (rows.c.buffer_id.desc(), rows.c.key.desc())
                        if descending
                        else (rows.c.buffer_id, rows.c.key)
                    )
                )
                .limit(1)
            )
            with handle.errors("find the next trajectory"), handle.read() as conn:
                found = conn.execute(stmt).scalar()
            return None if found is None else str(found)

        return TrajectoryView(name, task_id, where, steps, neighbour(True), neighbour(False))

    def group(self, name: str, key: str, *, group_by: str = "exp_meta.task_id") -> GroupView:
        """The rows whose ``group_by`` field equals ``key`` (a GRPO group: completions of
        one prompt), their group-normalised advantages (reward less the group's mean, over
        its standard deviation) and their claim records."""
        buffer = self.buffer(name)
        parse_path(group_by)
        keys, _ = buffer.sql.keys_after(
            Comparison(group_by, "eq", key), after=None, limit=MAX_PAGE, order_by="key"
        )
        if not keys:
            raise NotFound(f"buffer {name!r} holds no row with {group_by} = {key!r}")
        found = briefs(buffer, keys)
        rewards = [r.columns["exp_data.reward_t"] for r in found]
        known = np.asarray([r for r in rewards if r is not None], dtype=np.float64)
        mean = float(known.mean()) if len(known) else 0.0
        std = float(known.std()) if len(known) else 0.0
        advantages = [None if r is None else (r - mean) / (std + 1e-6) for r in rewards]
        return GroupView(
            name, key, group_by, found, advantages, buffer.lineage([r.id for r in found])
        )

    # -- live ------------------------------------------------------------------------------
    def live(self, name: str) -> dict[str, Any]:
        """The live page's numbers: rows and rows written per second, the policy version,
        staleness and reward by version over the newest rows, claims per consumer, the
        rate limit's counters. One snapshot serves every tab for ``live_every`` seconds."""
        buffer = self.buffer(name)
        with self._lock:
            state = self._live.setdefault(name, _Live())
            if time.monotonic() - state.at < self.live_every and state.snapshot:
                return state.snapshot
            snapshot = self._snapshot(buffer, state)
            state.at, state.snapshot = time.monotonic(), snapshot
            return snapshot

    def _snapshot(self, buffer: ReplayBuffer, state: _Live) -> dict[str, Any]:
        handle = buffer.sql.handle
        r = rate_limits.c
        head = (
            select(
                buffers.c.row_count,
                buffers.c.policy_version,
                buffers.c.inserted,
                r.samples,
                r.samples_per_insert,
                r.min_size,
            )
            .select_from(buffers.outerjoin(rate_limits, r.buffer_id == buffers.c.id))
            .where(buffers.c.id == handle.buffer_id)
        )
        state_now = claim_state(handle.dialect.now()).label("state")
        claims = (
            select(_C.consumer, state_now, func.count())
            .where(_C.buffer_id == handle.buffer_id, _C.acked_at.is_(None))
            .group_by(_C.consumer, state_now)
        )
        newest = newest_first(
            select(rows.c.policy_version, rows.c.reward_t, rows.c.execute_time),
            handle.buffer_id,
        ).limit(LIVE_ROWS)
        with handle.errors("read the live numbers"), handle.read() as conn:
            top = conn.execute(head).one()
            held = conn.execute(claims).all()
            recent = conn.execute(newest).all()
        self.live_statements += 3
        now = time.time()
        count = int(top.row_count)
        rate = None
        if state.rows_then is not None and now > state.rows_then[0]:
            rate = max(0.0, (int(top.inserted) - state.rows_then[1]) / (now - state.rows_then[0]))
        state.rows_then = (now, int(top.inserted))
        version = None if top.policy_version is None else int(top.policy_version)
        per: dict[str, dict[str, int]] = {}
        for consumer, claim, n in held:
            if consumer is not None and claim in ("leased", "expired"):
                per.setdefault(str(consumer), {"leased": 0, "expired": 0})[claim] += int(n)
        limit = None
        if top.samples_per_insert is not None:
            limit = {
                "inserted": int(top.inserted),
                "sampled": int(top.samples),
                "samples_per_insert": float(top.samples_per_insert),
                "min_size": int(top.min_size),
            }
        return {
            "rows": count,
            "rows_per_s": rate,
            "policy_version": version,
            "staleness": _staleness(recent, version),
            "by_version": _by_version(recent),
            "claims": per,
            "rate_limit": limit,
            "at": now,
        }


_C = consumption.c


def _limit_text(limiter: Any) -> str:
    return f"{limiter.samples_per_insert:g} samples per insert, min_size {limiter.min_size}" + (
        ", blocks writers" if limiter.block_writers else ""
    )


def _staleness(recent: Sequence[Any], version: int | None) -> list[tuple[str, int]]:
    """How many of the newest rows are 0, 1, 2 ... versions behind ``version``."""
    if version is None:
        return []
    behind: dict[int, int] = {}
    for row in recent:
        if row.policy_version is not None:
            lag = max(0, version - int(row.policy_version))
            behind[lag] = behind.get(lag, 0) + 1
    return [(str(k), behind[k]) for k in sorted(behind)][:30]


def _by_version(recent: Sequence[Any]) -> list[dict[str, Any]]:
    """Mean reward and success (reward > 0) per policy version over the newest rows."""
    grouped: dict[int, list[float]] = {}
    for row in recent:
        if row.policy_version is not None and row.reward_t is not None:
            grouped.setdefault(int(row.policy_version), []).append(float(row.reward_t))
    out = []
    for version in sorted(grouped)[-30:]:
        values = grouped[version]
        mean = sum(values) / len(values)
        out.append(
            {
                "version": version,
                "rows": len(values),
                "reward": mean if math.isfinite(mean) else None,
                "success": sum(v > 0 for v in values) / len(values),
            }
        )
    return out
