"""The row lifecycle: what happens around a buffer's rows as they are written and removed,
as one loop over the features that buffer uses.

A feature that acts on rows (a rate limit, tracked paths, arrays stored by digest, task
summaries, retention, tombstones) is a :class:`RowFeature` registered once with
:func:`register`. It says which values of the buffer's row it needs (:meth:`columns`) and
what they mean for this buffer (:meth:`setting`: ``None`` when the buffer does not use
it), and has hooks at the points of a row's life:

- a write (``storage.writer``): :meth:`prepare` before the rows are encoded,
  :meth:`before_insert` with the encoded chunks (it may replace them),
  :meth:`after_insert` once they are in (:meth:`WriteContext.new_keys` reads their keys,
  once, for every feature that asks), :meth:`after_write` last (eviction);
- a removal (:func:`~expstore.lifecycle.registry.remove`, evictions, retention):
  :meth:`before_remove` with the keys about to go, :meth:`after_remove` once they are gone.
  Where statements may modify in their WITH clause (Postgres), a feature that
  :attr:`~RowFeature.joins_removal` (tombstones) writes its records in the DELETE's own
  statement instead (:meth:`~RowFeature.removal_statements`): one round trip for both.

Every write reads the buffer's row once, locked, with one statement built from the
registered features' columns (compiled once per backend), into a :class:`BufferState`;
the write, and every removal in its transaction, then calls only the hooks of the
features whose setting is not ``None``. A buffer that uses no feature runs none of their
statements and none of their hooks: the state read, the insert and the buffer's counters
are the whole write (``tests/lifecycle/test_hooks.py`` counts them). Models: Reverb's
table with its extensions, SQLAlchemy's ``before_insert``/``after_insert`` events,
TorchRL's writer owning the write policy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from sqlalchemy import Connection, Integer, Text, bindparam, cast, func, select
from sqlalchemy.sql.elements import BindParameter, ColumnElement

from ..db.dialects import WRITE_COLUMNS
from ..db.handle import BufferHandle
from ..db.schema import buffers, newest_first, rows
from ..errors import InvalidArgumentError

__all__ = [
    "BufferState",
    "Fresh",
    "LazyWhere",
    "StateChanged",
    "changed_since_read",
    "hold_unchanged",
    "send_state",
    "RemoveContext",
    "Removed",
    "RowFeature",
    "WriteContext",
    "read_state",
    "register",
    "registered",
    "unregister",
]


_ID_AT = WRITE_COLUMNS.index("id")


class Fresh(NamedTuple):
    """Rows a write inserted, as encoded (WRITE_COLUMNS order), and their keys."""

    keys: list[int]
    rows: list[tuple[Any, ...]]

    @property
    def ids(self) -> list[str]:
        return [row[_ID_AT] for row in self.rows]


class Removed:
    """What removals in one transaction took, by reason (``capacity``, ``stale``,
    ``delete``, ``clear``), and how many of them had keys above ``newer_than`` (a write's
    own rows, evicted by the write that stored them)."""

    def __init__(self, newer_than: int | None = None, *, deferred: bool = False) -> None:
        self.newer_than = newer_than
        self.by_reason: dict[str, int] = {}
        self.new = 0
        #: ``deferred``: the caller updates the buffer's row count once, at its end, by
        #: ``uncounted`` (a write, which also counts its inserts there).
        self.deferred = deferred
        self.uncounted = 0
        #: Whether readers must see these removals by a new version of the buffer, which
        #: the caller's count then gives (deletes; evictions give their own).
        self.changed = False
        #: Rows of the caller's write that a statement of its removals counted already
        #: on the buffer's row, with the version those removals need
        #: (:func:`~expstore.lifecycle.registry.remove_ids` on Postgres).
        self.counted_inserts = 0

    def add(self, reason: str, keys: Iterable[int], count: int) -> None:
        self.by_reason[reason] = self.by_reason.get(reason, 0) + count
        if self.newer_than is not None:
            self.new += sum(1 for k in keys if k > self.newer_than)

    @property
    def total(self) -> int:
        return sum(self.by_reason.values())


@dataclass
class BufferState:
    """The buffer's row as one write (and the removals in its transaction) found it:
    ``newest``, its largest key (0 when empty); ``keys``, what the backend needs to hand
    keys out (see :meth:`~expstore.db.dialects.Dialect.key_state`); and each registered
    feature's setting by name (``None``: the buffer does not use it)."""

    newest: int
    keys: tuple[Any, ...]
    settings: dict[str, Any]
    #: Read without the buffer's row (:func:`send_state` with ``fingerprint``): a digest
    #: of every feature's settings as read, which :func:`hold_unchanged` checks once the
    #: row is held. None: read holding it.
    fingerprint: str | None = None

    def setting(self, name: str) -> Any:
        return self.settings.get(name)

    def reads_unlocked(self) -> bool:
        """Whether every feature this buffer uses may run its hooks on a state read
        without the buffer's row (:attr:`RowFeature.reads_unlocked`)."""
        settings = self.settings
        return all(f.reads_unlocked for f in _FEATURES if settings.get(f.name) is not None)

    def hooked(self, hook: str) -> list[tuple[RowFeature, Any]]:
        """The features this buffer uses that have ``hook`` (a method they override), in
        their order, with their settings (as they are now: a hook may change its own)."""
        settings = self.settings
        return [
            (feature, settings[feature.name])
            for feature in _HOOKED[hook]
            if settings.get(feature.name) is not None
        ]

    def run(self, hook: str, ctx: WriteContext | RemoveContext) -> None:
        """``hook(ctx, setting)`` of each feature this buffer uses that has it."""
        settings = self.settings
        for feature in _HOOKED[hook]:
            setting = settings.get(feature.name)
            if setting is not None:
                getattr(feature, hook)(ctx, setting)


@dataclass
class WriteContext:
    """One write of a batch, in its transaction: what the hooks read and change."""

    handle: BufferHandle
    conn: Connection
    state: BufferState
    #: The rows being written (a :class:`~expstore.storage.writer.RowSource`).
    batch: Any
    #: The encoded rows, chunk by chunk, as the insert will take them.
    chunks: Iterator[list[tuple[Any, ...]]]
    #: How many rows of the batch go in (fewer than the batch after dedup).
    stored: int
    removed: Removed
    #: What a feature keeps between its hooks in this write, under its name.
    notes: dict[str, Any] = field(default_factory=dict)
    #: The rows inserted as encoded and their keys, where the insert said them (see
    #: :meth:`inserted`); else None.
    fresh: Fresh | None = None
    _keys: dict[str, int] | None = None

    def inserted(self, encoded: list[tuple[Any, ...]], keys: Sequence[int]) -> None:
        """The insert put ``encoded`` (in WRITE_COLUMNS order) under ``keys``:
        :meth:`new_keys` needs no statement."""
        self.fresh = Fresh(list(keys), encoded)
        self._keys = {row[_ID_AT]: key for key, row in zip(keys, encoded, strict=True)}

    def new_keys(self) -> dict[str, int]:
        """The keys of this write's rows by id, read once (writers of a buffer take turns,
        so the rows above the largest key before the write are the write's)."""
        if self._keys is None:
            stmt = select(rows.c.id, rows.c.key).where(
                rows.c.buffer_id == self.handle.buffer_id, rows.c.key > self.state.newest
            )
            self._keys = {str(i): int(k) for i, k in self.conn.execute(stmt)}
        return self._keys


class LazyWhere(Sequence[Any]):
    """A removal's condition built only if a hook reads it (:attr:`RemoveContext.where`):
    building SQLAlchemy expressions on every capped write cost more than its statements'
    Python."""

    def __init__(self, build: Callable[[], Sequence[ColumnElement[bool]]]) -> None:
        self._build = build
        self._built: Sequence[ColumnElement[bool]] | None = None

    def _clauses(self) -> Sequence[ColumnElement[bool]]:
        if self._built is None:
            self._built = self._build()
        return self._built

    def __getitem__(self, at: Any) -> Any:
        return self._clauses()[at]

    def __len__(self) -> int:
        return len(self._clauses())


@dataclass
class RemoveContext:
    """One removal of a buffer's rows, in the caller's transaction (which holds the
    buffer's row)."""

    handle: BufferHandle
    conn: Connection
    state: BufferState
    #: The keys of the rows going, ascending, locked.
    keys: list[int]
    #: The condition that chose them (some summaries are computed from it).
    where: Sequence[ColumnElement[bool]]
    reason: str
    #: The eviction policy, for evictions.
    policy: str | None
    #: How many went (set after the delete).
    gone: int = 0
    notes: dict[str, Any] = field(default_factory=dict)


class RowFeature(ABC):
    """A feature that joins the row lifecycle (see the module). Subclasses set ``name``
    (unique) and ``order`` (hooks run in ascending order), and override the hooks they
    need; the rest do nothing."""

    name: ClassVar[str]
    order: ClassVar[int] = 50
    #: Whether, where the database's statements may modify in their WITH clause
    #: (:attr:`~expstore.db.dialects.Dialect.modifying_ctes`), a removal runs
    #: :meth:`removal_statements` in the rows' DELETE (one round trip for all) instead
    #: of :meth:`before_remove`.
    joins_removal: ClassVar[bool] = False
    #: Whether a write may run this feature's hooks on its setting as read before the
    #: write holds the buffer's row (:func:`send_state` with ``fingerprint``), provided
    #: its :meth:`settings_columns` are unchanged once it does: its hooks before the
    #: insert read nothing else (a feature whose setting is None is passed over).
    reads_unlocked: ClassVar[bool] = False

    @abstractmethod
    def columns(self, buffer_id: BindParameter[int]) -> Sequence[ColumnElement[Any]]:
        """What the feature reads of the buffer with every write: columns of
        ``expstore_buffers`` or scalar subqueries (``buffer_id``: the buffer's id, bound)."""

    @abstractmethod
    def setting(self, values: Sequence[Any]) -> Any:
        """The feature's setting for this buffer from those values, in their order;
        ``None`` when the buffer does not use the feature (then no hook of it runs)."""

    def settings_columns(self, columns: Sequence[Any]) -> Sequence[Any]:
        """Of :meth:`columns` (as given), those that are settings, which writes leave as
        they are (not counts that every write or removal moves): what a write that read
        them before holding the buffer's row finds unchanged (:func:`hold_unchanged`). By
        default all."""
        return columns

    def prepare(self, ctx: WriteContext, setting: Any) -> None:
        """Before the batch is encoded."""
        return None

    def before_insert(self, ctx: WriteContext, setting: Any) -> None:
        """With the encoded rows (``ctx.chunks``), before they go in."""
        return None

    def after_insert(self, ctx: WriteContext, setting: Any) -> None:
        """Once the rows are in (``ctx.new_keys()``: their keys)."""
        return None

    def after_write(self, ctx: WriteContext, setting: Any) -> None:
        """Last in the write's transaction, after every feature's :meth:`after_insert`."""
        return None

    def quiet_after(self, ctx: WriteContext, setting: Any) -> bool:
        """Whether this write's :meth:`after_insert` and :meth:`after_write` would do
        nothing (its rows encoded already): then the write may skip them, and send its
        insert later in the transaction (with the COMMIT). By default no."""
        return False

    def before_remove(self, ctx: RemoveContext, setting: Any) -> None:
        """With the keys about to go (``ctx.keys``), still present."""
        return None

    def after_remove(self, ctx: RemoveContext, setting: Any) -> None:
        """Once they are gone (``ctx.gone``: how many)."""
        return None

    def removal_statements(self, dialect: Any) -> Sequence[Any]:
        """Where :attr:`joins_removal`: this feature's :meth:`before_remove` as
        INSERT/UPDATE/DELETE statements for ``dialect`` that run in the WITH clause of the
        rows' DELETE, reading the rows as they were before it (bound parameters only:
        ``keys``, the rows going, and the feature's own, named apart from other
        features'; built once per backend)."""
        raise NotImplementedError

    def removal_params(self, ctx: RemoveContext, setting: Any) -> dict[str, Any]:
        """The values of :meth:`removal_statements`' parameters for this removal, which
        they then do instead of :meth:`before_remove`."""
        raise NotImplementedError


_FEATURES: list[RowFeature] = []
HOOKS = ("prepare", "before_insert", "after_insert", "after_write", "before_remove", "after_remove")
#: The registered features that override each hook, in their order.
_HOOKED: dict[str, list[RowFeature]] = {hook: [] for hook in HOOKS}
#: (the statement, each feature's span of its columns, where the key state ends)
_Compiled = tuple[Any, list[tuple[RowFeature, int, int]], int, int]
#: The state statement, by backend, lock and fingerprint (built from the features
#: registered at first use).
_STATEMENTS: dict[tuple[str, bool, bool], _Compiled] = {}
#: What the check of :func:`hold_unchanged` raises (a cast of this text, and the buffer's
#: name, to an integer), found again by :func:`changed_since_read`.
_CHANGED = "expstore: the settings of buffer "


def register(feature: RowFeature) -> RowFeature:
    """Add ``feature`` to every buffer's lifecycle (once per name; at import of its
    module)."""
    if any(f.name == feature.name for f in _FEATURES):
        raise InvalidArgumentError(f"a row feature named {feature.name!r} is registered already")
    _FEATURES.append(feature)
    _FEATURES.sort(key=lambda f: f.order)
    for hook, having in _HOOKED.items():
        having[:] = [
            f for f in _FEATURES if getattr(type(f), hook) is not getattr(RowFeature, hook)
        ]
    _STATEMENTS.clear()
    return feature


def unregister(name: str) -> None:
    """Take the feature named ``name`` out of every buffer's lifecycle (a plugin's, or a
    test's); InvalidArgumentError if none is registered by that name."""
    found = [f for f in _FEATURES if f.name == name]
    if not found:
        raise InvalidArgumentError(f"no row feature named {name!r} is registered")
    _FEATURES.remove(found[0])
    for having in _HOOKED.values():
        having[:] = [f for f in having if f.name != name]
    _STATEMENTS.clear()


def registered() -> list[RowFeature]:
    """The registered features, in hook order."""
    return list(_FEATURES)


def _fingerprint(buffer_id: Any) -> Any:
    """A digest of every registered feature's settings columns (Postgres)."""
    parts = [
        func.coalesce(cast(column, Text), "~")
        for feature in _FEATURES
        for column in feature.settings_columns(list(feature.columns(buffer_id)))
    ]
    return func.md5(func.concat_ws("|", *parts))


def _statement(handle: BufferHandle, locked: bool, fingerprint: bool = False) -> _Compiled:
    dialect = handle.dialect
    found = _STATEMENTS.get((dialect.name, locked, fingerprint))
    if found is not None:
        return found
    buffer_id = bindparam("buffer_id", type_=Integer)
    newest = newest_first(select(rows.c.key), buffer_id).limit(1).scalar_subquery()  # type: ignore[arg-type]
    columns: list[Any] = [buffers.c.name, buffers.c.created_at, newest, *dialect.key_state()]
    keys_end = len(columns)
    if locked:
        columns.extend(dialect.state_check(buffer_id))
    check_end = len(columns)
    spans = []
    for feature in _FEATURES:
        own = list(feature.columns(buffer_id))
        spans.append((feature, len(columns), len(columns) + len(own)))
        columns.extend(own)
    if fingerprint:
        columns.append(_fingerprint(buffer_id))
    stmt: Any = select(*columns).where(buffers.c.id == buffer_id)
    if locked:
        stmt = dialect.locked(stmt)
    found = _STATEMENTS[(dialect.name, locked, fingerprint)] = (
        stmt,
        spans,
        keys_end,
        check_end,
    )
    return found


def read_state(
    handle: BufferHandle, conn: Connection, *, locked: bool = True, fingerprint: bool = False
) -> BufferState:
    """The buffer's state in one statement (``locked``: its row held until the
    transaction ends; StorageError if the row no longer is the handle's buffer)."""
    return send_state(handle, conn, locked=locked, fingerprint=fingerprint)()


def send_state(
    handle: BufferHandle, conn: Connection, *, locked: bool = True, fingerprint: bool = False
) -> Callable[[], BufferState]:
    """:func:`read_state`'s statement, sent now; the function returned reads it.
    ``fingerprint`` (Postgres, not ``locked``): with the digest of the features'
    settings, for a write that takes the row later (:func:`hold_unchanged`)."""
    stmt, spans, keys_end, check_end = _statement(handle, locked, fingerprint)
    # compiled once per handle, run on the driver's cursor
    key = ("buffer state", locked, fingerprint, len(_FEATURES))  # (registered later: anew)
    compiled = handle.statement(key, lambda: stmt)
    sent = compiled.send(conn, buffer_id=handle.buffer_id)

    def read() -> BufferState:
        got = sent.rows()
        if not got:
            raise handle.recreated(None)
        found = got[0]
        handle.check_row(found[0], float(found[1]))
        if check_end > keys_end and found[keys_end] != found[keys_end + 1]:
            # The row changed while this waited for it: read again, holding it now.
            return read_state(handle, conn, locked=False, fingerprint=fingerprint)
        settings = {f.name: f.setting(found[start:stop]) for f, start, stop in spans}
        digest = str(found[-1]) if fingerprint else None
        return BufferState(int(found[2] or 0), tuple(found[3:keys_end]), settings, digest)

    return read


def hold_unchanged(handle: BufferHandle, conn: Connection, state: BufferState) -> list[Any]:
    """Send (their results unread: returned, :class:`~expstore.db.compiled.Pending`) the
    statements that take the buffer's row for a write whose ``state`` was read without it
    (its ``fingerprint``), then check, in a snapshot taken once the row is held (every
    change of a feature's settings holds the row until it commits), that every
    feature's settings are as that state read them: else the check raises (a
    DBAPIError that :func:`changed_since_read` recognises), failing the transaction.
    Meant for a pipeline (:mod:`expstore.db.pipeline`), before the write's insert: one
    round trip for the lock, the check, the insert and the COMMIT."""
    dialect = handle.dialect

    def lock() -> Any:
        return dialect.locked(
            select(buffers.c.id).where(buffers.c.id == bindparam("buffer_id", type_=Integer))
        )

    def check() -> Any:
        buffer_id = bindparam("buffer_id", type_=Integer)
        # (the cast reads the row: never folded into a constant, so raised only here)
        raised = cast(func.concat(_CHANGED, buffers.c.name, " changed"), Integer)
        differs = _fingerprint(buffer_id) != bindparam("seen", type_=Text)
        return select(raised).where(buffers.c.id == buffer_id, differs)

    return [
        handle.statement(("hold buffer",), lock).send(conn, buffer_id=handle.buffer_id),
        handle.statement(("buffer unchanged", len(_FEATURES)), check).send(
            conn, buffer_id=handle.buffer_id, seen=state.fingerprint
        ),
    ]


class StateChanged(Exception):
    """Internal: a write that read the buffer's state before holding its row found its
    settings changed once it held it (rolled back: the caller writes again, holding the
    row from the start)."""


def changed_since_read(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) is the failed check of :func:`hold_unchanged`."""
    while exc is not None:
        if _CHANGED in str(getattr(exc, "orig", None) or ""):
            return True
        exc = exc.__cause__
    return False
