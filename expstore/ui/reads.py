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
from functools import cached_property
from typing import Any

import numpy as np
from sqlalchemy import Text, case, cast, distinct, exists, func, literal, select

from ..buffer import ReplayBuffer
from ..claims.reports import Lineage, claim_state
from ..codec.format import ESCAPED_KEY, FLOAT_KEY, TENSOR_KEY
from ..db.engine import create_sql_engine
from ..db.schema import buffers, consumption, newest_first, produced, rate_limits, rows
from ..errors import ExpstoreError, InvalidArgumentError
from ..model.images import AUTO_MIN_SIDE
from ..model.layout import META_COLUMNS, ORDERABLE, PAYLOAD_FIELDS, SCALAR_COLUMNS
from ..model.paths import MISSING, parse_path, read_path
from ..model.rows import DataRow
from ..query import And, Comparison, Condition, parse_where, to_sql
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
    "TASK_SORTS",
    "TaskLine",
    "TasksView",
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
    #: The digest of an array stored once by digest (64 KiB or more): two steps showing
    #: the same screenshot share it (what ``unchanged(path)`` compares), None otherwise.
    digest: str | None = None

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
    each array as an :class:`ArrayRef` (read from the stored document when first asked
    for: a long trajectory's page starts before all its steps' documents are read)."""

    key: int
    id: str
    columns: dict[str, Any]
    #: The stored document (JSON text, or a dict where the driver decodes it).
    document: Any = field(repr=False)

    @cached_property
    def payload(self) -> dict[str, Any]:
        """The payload fields, arrays as ArrayRefs."""
        found = self.document
        document = json.loads(found) if isinstance(found, str) else dict(found or {})
        return {name: _described(document.get(name), f"exp_data.{name}") for name in PAYLOAD_FIELDS}

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
                digest = inner.get("digest")
                return ArrayRef(
                    path,
                    str(inner.get("dtype", "?")),
                    shape,
                    digest if isinstance(digest, str) else None,
                )
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
        out.append(Brief(key, str(r.id), columns, r.data))
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
    #: The keys of the steps the filter matches (empty without a filter).
    matching: frozenset[int] = frozenset()


@dataclass(frozen=True)
class GroupView:
    """A GRPO group: its completions, with advantages and claim records."""

    buffer: str
    key: str
    group_by: str
    rows: list[Brief]
    advantages: list[float | None]
    lineage: dict[str, Lineage]


@dataclass(frozen=True)
class TaskLine:
    """One task (or GRPO group: the completions of one prompt share a ``task_id``) on the
    tasks and groups pages, from its rows' typed columns: steps, return (the sum of its
    rewards), mean and spread of its rewards, rows rewarded above 0, its final reward (of
    its last row, by step then insertion, as ``expstore stats`` counts success), agents,
    versions, times, and the rows of it the filter matches."""

    task_id: str
    length: int
    total: float | None
    mean: float | None
    std: float | None
    correct: int
    final: float | None
    agents: tuple[str, ...]
    agent_count: int
    versions: tuple[int | None, int | None]
    started: float
    ended: float
    matches: int
    first_key: int

    @property
    def success(self) -> bool | None:
        """Whether the task succeeded (its final reward above 0), None without a reward."""
        return None if self.final is None else self.final > 0

    @property
    def duration(self) -> float:
        return self.ended - self.started


@dataclass(frozen=True)
class TasksView:
    """A page of the tasks (or groups) list: the tasks with a row the filter matches."""

    buffer: str
    where: str
    sort: str
    offset: int
    limit: int
    tasks: list[TaskLine]
    total_tasks: int
    total_matches: int
    more: bool
    #: Per task on the page: its rows by claim state (``unclaimed``, ``leased``...).
    claims: dict[str, dict[str, int]]
    #: Per task on the page: its first row (for the prompt of a group).
    first_rows: dict[str, Brief]


#: How the tasks page sorts: by first row (the order tasks began in), or a figure.
TASK_SORTS = (
    "first",
    "task",
    "length",
    "return",
    "success",
    "mean",
    "std",
    "correct",
    "version",
    "started",
    "duration",
)


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
        row = self.buffer(name).get(row_id)
        if row is None:
            raise NotFound(f"buffer {name!r} holds no row with id {row_id!r}")
        value = read_path(row, parse_path(path))
        if value is MISSING:
            raise NotFound(f"row {row_id!r} has nothing at {path!r}")
        return value

    def completions(self, name: str, row_id: str) -> list[tuple[str, str]]:
        """The rows acks produced from prompt ``row_id`` of buffer ``name`` (its
        completions, through lineage), as (buffer, row id), oldest first: one statement."""
        handle = self.buffer(name).sql.handle
        made = rows.alias("made")
        stmt = (
            select(buffers.c.name, made.c.id)
            .select_from(
                produced.join(made, made.c.key == produced.c.key).join(
                    buffers, buffers.c.id == produced.c.buffer_id
                )
            )
            .where(produced.c.prompt_buffer_id == handle.buffer_id, produced.c.prompt_id == row_id)
            .order_by(produced.c.key)
            .limit(MAX_ROWS_SHOWN)
        )
        with handle.errors("read a prompt's completions"), handle.read() as conn:
            return [(str(b), str(i)) for b, i in conn.execute(stmt)]

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

        matched: frozenset[int] = frozenset()
        if condition is not None:
            hits, _ = buffer.sql.keys_after(
                And((mine, condition)), after=None, limit=MAX_PAGE, order_by="key"
            )
            matched = frozenset(hits)
        return TrajectoryView(
            name, task_id, where, steps, neighbour(True), neighbour(False), matched
        )

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

    def tasks(
        self,
        name: str,
        *,
        where: str = "",
        sort: str = "first",
        offset: int = 0,
        limit: int = 50,
        claims: bool = False,
    ) -> TasksView:
        """A page of the buffer's tasks that have a row ``where`` matches (every task
        without a filter), one :class:`TaskLine` each, sorted by ``sort`` (a name of
        :data:`TASK_SORTS`, a leading '-' for descending). One statement, a pass over the
        buffer's typed columns (never a payload; about 0.4 s per 100,000 rows on SQLite),
        plus one for the first rows of the page's tasks and, with ``claims``, one for
        their claim states."""
        buffer = self.buffer(name)
        descending = sort.startswith("-")
        if sort.lstrip("-") not in TASK_SORTS:
            raise InvalidArgumentError(
                f"tasks sort by {', '.join(TASK_SORTS)} (a leading '-' for descending), "
                f"not {sort!r}"
            )
        if not 1 <= limit <= MAX_ROWS_SHOWN or offset < 0:
            raise InvalidArgumentError(
                f"a page shows 1 to {MAX_ROWS_SHOWN} tasks from an offset of 0 or more, not "
                f"{limit} from {offset}"
            )
        handle = buffer.sql.handle
        condition = parse_where(where) if where.strip() else None
        matching = to_sql(condition, rows, handle.dialect.name)
        c = rows.c
        ranked = (
            select(
                c.task_id,
                c.key,
                c.reward_t,
                c.agent_id,
                c.policy_version,
                c.execute_time,
                (literal(1) if matching is None else case((matching, 1), else_=0)).label("m"),
                func.row_number()
                .over(partition_by=c.task_id, order_by=(c.step.desc(), c.key.desc()))
                .label("rn"),
            )
            .where(c.buffer_id == handle.buffer_id)
            .subquery("ranked")
        )
        r = ranked.c
        final = func.max(case((r.rn == 1, r.reward_t)))
        per = (
            select(
                r.task_id,
                func.count().label("length"),
                func.sum(r.reward_t).label("total"),
                func.avg(r.reward_t).label("mean"),
                func.avg(r.reward_t * r.reward_t).label("mean_square"),
                func.count(case((r.reward_t > 0, 1))).label("correct"),
                final.label("final"),
                case((final > 0, 1), else_=0).label("success"),
                func.min(r.agent_id).label("agent_low"),
                func.max(r.agent_id).label("agent_high"),
                func.count(distinct(r.agent_id)).label("agent_count"),
                func.min(r.policy_version).label("version_low"),
                func.max(r.policy_version).label("version"),
                func.min(r.execute_time).label("started"),
                func.max(r.execute_time).label("ended"),
                (func.max(r.execute_time) - func.min(r.execute_time)).label("duration"),
                func.sum(r.m).label("matches"),
                func.min(r.key).label("first"),
            )
            .group_by(r.task_id)
            .having(func.sum(r.m) > 0)
        ).subquery("per_task")
        p = per.c
        by = {
            "first": p.first,
            "task": p.task_id,
            "length": p.length,
            "return": p.total,
            "success": p.success,
            "mean": p.mean,
            "std": p.mean_square - p.mean * p.mean,
            "correct": p.correct,
            "version": p.version,
            "started": p.started,
            "duration": p.duration,
        }[sort.lstrip("-")]
        # The totals ride along as window aggregates over every task (computed before the
        # page's LIMIT): one pass over the rows, not two.
        page = (
            select(
                per,
                func.count().over().label("total_tasks"),
                func.sum(p.matches).over().label("total_matches"),
            )
            .order_by(by.desc() if descending else by.asc(), p.first)
            .offset(offset)
            .limit(limit + 1)
        )
        with handle.errors("read the tasks"), handle.read() as conn:
            found = conn.execute(page).all()
            if found:
                total_tasks, total_matches = found[0].total_tasks, found[0].total_matches
            elif offset:  # past the last page: count them
                total_tasks, total_matches = conn.execute(
                    select(func.count(), func.sum(p.matches))
                ).one()
            else:
                total_tasks = total_matches = 0
        lines = [_task_line(t) for t in found[:limit]]
        held: dict[str, dict[str, int]] = {}
        if claims and lines:
            held = self._claims_of(buffer, [t.task_id for t in lines])
        firsts = briefs(buffer, [t.first_key for t in lines])
        return TasksView(
            name,
            where,
            sort,
            offset,
            limit,
            lines,
            int(total_tasks or 0),
            int(total_matches or 0),
            len(found) > limit,
            held,
            {b.columns["exp_meta.task_id"]: b for b in firsts},
        )

    @staticmethod
    def _claims_of(buffer: ReplayBuffer, task_ids: Sequence[str]) -> dict[str, dict[str, int]]:
        """Each task's rows by claim state: one statement."""
        handle = buffer.sql.handle
        state = claim_state(handle.dialect.now()).label("state")
        stmt = (
            select(rows.c.task_id, state, func.count())
            .select_from(rows.outerjoin(consumption, _C.key == rows.c.key))
            .where(rows.c.buffer_id == handle.buffer_id, rows.c.task_id.in_(list(task_ids)))
            .group_by(rows.c.task_id, state)
        )
        out: dict[str, dict[str, int]] = {t: {} for t in task_ids}
        with handle.errors("read claim states"), handle.read() as conn:
            for task, claim, n in conn.execute(stmt):
                out.setdefault(str(task), {})[str(claim)] = int(n)
        return out

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
            select(
                rows.c.key,
                rows.c.task_id,
                rows.c.step,
                rows.c.policy_version,
                rows.c.reward_t,
                rows.c.execute_time,
            ),
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
        finals = _task_finals(recent)
        judged = [f for f in finals if f.reward_t is not None]
        return {
            "rows": count,
            "rows_per_s": rate,
            "policy_version": version,
            "tasks": len(judged),
            "success": (
                sum(float(f.reward_t) > 0 for f in judged) / len(judged) if judged else None
            ),
            "series": _series(recent, finals),
            "staleness": _staleness(recent, version),
            "by_version": _by_version(recent, finals),
            "claims": per,
            "rate_limit": limit,
            "at": now,
        }


_C = consumption.c


def _task_line(t: Any) -> TaskLine:
    mean = None if t.mean is None else float(t.mean)
    std = None
    if mean is not None and t.mean_square is not None:
        std = math.sqrt(max(0.0, float(t.mean_square) - mean * mean))
    agents = (str(t.agent_low),) if t.agent_count <= 1 else (str(t.agent_low), str(t.agent_high))
    return TaskLine(
        str(t.task_id),
        int(t.length),
        None if t.total is None else float(t.total),
        mean,
        std,
        int(t.correct),
        None if t.final is None else float(t.final),
        agents,
        int(t.agent_count),
        (
            None if t.version_low is None else int(t.version_low),
            None if t.version is None else int(t.version),
        ),
        float(t.started),
        float(t.ended),
        int(t.matches),
        int(t.first),
    )


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


def _task_finals(recent: Sequence[Any]) -> list[Any]:
    """The last row (largest step, then key) of each task among the newest rows: whether
    a task succeeded is its final reward above 0, as ``expstore stats`` counts it (a
    shaping reward on an earlier step is no success)."""
    last: dict[str, Any] = {}
    for row in recent:
        seen = last.get(row.task_id)
        if seen is None or (row.step, row.key) > (seen.step, seen.key):
            last[row.task_id] = row
    return list(last.values())


def _mean(values: Sequence[float]) -> float | None:
    if not values:
        return None
    mean = sum(values) / len(values)
    return mean if math.isfinite(mean) else None


#: Time bins of the live page's series.
SERIES_BINS = 24


def _series(recent: Sequence[Any], finals: Sequence[Any]) -> dict[str, list[Any]]:
    """Over the newest rows' span of time, in :data:`SERIES_BINS` bins: rows written per
    second, their mean reward, and the success of the tasks that ended in each bin (by
    their last row's time); x is each bin's middle in seconds before the newest row."""
    if not recent:
        return {"rows_per_s": [], "reward": [], "success": []}
    times = [float(r.execute_time) for r in recent]
    end, start = max(times), min(times)
    width = max((end - start) / SERIES_BINS, 1e-3)
    bins = max(1, min(SERIES_BINS, math.ceil((end - start) / width + 1e-9)))

    def at(t: float) -> int:
        return min(bins - 1, int((t - start) / width))

    counts = [0] * bins
    rewards: list[list[float]] = [[] for _ in range(bins)]
    for r in recent:
        i = at(float(r.execute_time))
        counts[i] += 1
        if r.reward_t is not None:
            rewards[i].append(float(r.reward_t))
    ended: list[list[bool]] = [[] for _ in range(bins)]
    for f in finals:
        if f.reward_t is not None:
            ended[at(float(f.execute_time))].append(float(f.reward_t) > 0)
    middle = [start + (i + 0.5) * width - end for i in range(bins)]
    return {
        "rows_per_s": [(x, n / width) for x, n in zip(middle, counts, strict=True)],
        "reward": [(x, _mean(v)) for x, v in zip(middle, rewards, strict=True)],
        "success": [(x, _mean([float(s) for s in v])) for x, v in zip(middle, ended, strict=True)],
    }


def _by_version(recent: Sequence[Any], finals: Sequence[Any]) -> list[dict[str, Any]]:
    """Per policy version over the newest rows: mean reward of its rows, and the success
    of the tasks whose last row it made (the final reward above 0)."""
    grouped: dict[int, list[float]] = {}
    for row in recent:
        if row.policy_version is not None and row.reward_t is not None:
            grouped.setdefault(int(row.policy_version), []).append(float(row.reward_t))
    tasks: dict[int, list[float]] = {}
    for f in finals:
        if f.policy_version is not None and f.reward_t is not None:
            tasks.setdefault(int(f.policy_version), []).append(float(float(f.reward_t) > 0))
    out = []
    for version in sorted(grouped)[-30:]:
        values = grouped[version]
        out.append(
            {
                "version": version,
                "rows": len(values),
                "reward": _mean(values),
                "tasks": len(tasks.get(version, [])),
                "success": _mean(tasks.get(version, [])),
            }
        )
    return out
