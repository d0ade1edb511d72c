"""Read routing: reads from Postgres streaming replicas, writes to the primary.

``ReplayBuffer(url, read_urls=[replica, ...])`` sends what only reads (sampling: key
indexes, key spaces and fetches; queries, counts, stats, export, queue statistics) to the
first replica that is up, and everything that writes (store, claims and acks, priorities,
retention, versions, rate-limit counts) to the primary. A read happens on one connection
of one server, so what a sampler chooses on a replica is fetched from that replica's same
or later state: a key the replica lacks is never returned half-read (it is chosen again).

Lag: a replica answers as of what it has replayed. With ``read_your_writes=True`` a read
after this handle's write waits (polling, up to ``wait_s``) until the replica has replayed
the write's commit (Postgres LSNs: ``pg_current_wal_lsn()`` on the primary after the
commit, ``pg_last_wal_replay_lsn()`` on the replica), and reads from the primary if it does
not come in time. With ``max_lag_s`` a replica whose replay is more than that many seconds
behind while the primary has WAL it lacks is left for the primary until it catches up.

Failures: a replica that cannot be reached (at open or later) is left for ``retry_s``
seconds, with a :class:`~expstore.ReplicaWarning`; reads go to the next replica or the
primary meanwhile, and come back when it does. A replica lost in the middle of a read
raises :class:`~expstore.ConnectionLostError`, which ``ReplayBuffer.sample`` retries
elsewhere (as it does when a connection to the primary is cut in the middle of a read).

At open each read URL is checked: it must be Postgres, in recovery (a standby, not a
primary), and a copy of the primary's cluster (the same system identifier). Its first
read waits, as a read-your-writes read does, until it has replayed the buffer's creation
(a standby made moments ago may not have the tables yet).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Engine, func, literal, select
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.types import UserDefinedType

from .._retry import REPLICA_CATCH_UP
from ..errors import ConnectionLostError, InvalidArgumentError, ReplicaError, ReplicaWarning
from .engine import create_sql_engine, normalise_url

__all__ = ["ReadRouter"]

#: How often (seconds) a replica's lag is measured when ``max_lag_s`` is set.
_LAG_EVERY = 1.0


class _Replica:
    def __init__(self, url: URL) -> None:
        self.url = url
        self.engine = create_sql_engine(url)
        self.down_until = 0.0  # reads avoid it until then
        self.lagging = False
        self.lag_checked = 0.0
        #: The last of this handle's write positions the replica was seen to have replayed.
        self.confirmed: str | None = None

    def shown(self) -> str:
        return self.url.render_as_string(hide_password=True)


class ReadRouter:
    """Where a read goes: the first replica that is up and caught up, else the primary."""

    def __init__(
        self,
        primary: Engine,
        read_urls: Sequence[str | URL],
        *,
        read_your_writes: bool = False,
        max_lag_s: float | None = None,
        wait_s: float = 5.0,
        retry_s: float = 5.0,
    ) -> None:
        if isinstance(read_urls, (str, URL)) or not isinstance(read_urls, Sequence):
            raise InvalidArgumentError(
                f"read_urls must be a list of replica URLs, got {read_urls!r}; pass "
                "read_urls=['postgresql+psycopg://host:5433/db']"
            )
        if primary.dialect.name != "postgresql":
            raise InvalidArgumentError(
                "read_urls needs a Postgres primary (SQLite has no streaming replicas); "
                "open the SQLite file without read_urls"
            )
        for name, value in (("max_lag_s", max_lag_s), ("wait_s", wait_s), ("retry_s", retry_s)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0
            ):
                raise InvalidArgumentError(f"{name} must be a number of seconds > 0, got {value!r}")
        self.primary = primary
        self.replicas = [_Replica(normalise_url(u)) for u in read_urls]
        for replica in self.replicas:
            if replica.engine.dialect.name != "postgresql":
                raise ReplicaError(
                    f"read URL {replica.shown()} is not Postgres; replicas are Postgres "
                    "streaming standbys of the primary"
                )
        self.read_your_writes = bool(read_your_writes)
        self.max_lag_s = max_lag_s
        self.wait_s = float(wait_s)
        self.retry_s = float(retry_s)
        self._pending_lsn: str | None = None
        self._primary_once = False
        self._lock = threading.Lock()

    # -- at open ---------------------------------------------------------------------------
    def check(self) -> None:
        """Check every read URL against the primary: ReplicaError for one that is a primary
        or a copy of another cluster; a warning for one that cannot be reached now. Reads
        wait (up to ``wait_s``, then the primary serves) for a replica to replay the
        buffer's creation."""
        with self.primary.connect() as conn:
            system = _system_id(conn)
            # The buffer exists on the primary now (schema, its row): a replica serves reads
            # once it has replayed that far, whether or not read_your_writes is on (a fresh
            # standby may not have the tables yet).
            self._pending_lsn = str(conn.execute(select(func.pg_current_wal_lsn())).scalar_one())
        for replica in self.replicas:
            try:
                with replica.engine.connect() as conn:
                    recovering = conn.execute(select(func.pg_is_in_recovery())).scalar_one()
                    theirs = _system_id(conn)
            except DBAPIError as exc:
                self._down(replica, f"cannot be reached ({_reason(exc)})")
                continue
            if not recovering:
                raise ReplicaError(
                    f"read URL {replica.shown()} is a primary, not a replica (it is not in "
                    "recovery): writes there would never reach this buffer's primary. Give "
                    "the URL of a streaming standby of the primary, or open that database as "
                    "the buffer's URL"
                )
            if theirs != system:
                raise ReplicaError(
                    f"read URL {replica.shown()} is a replica of another cluster (system "
                    f"identifier {theirs}, the primary's is {system}); give a standby made "
                    "from this primary (pg_basebackup -R from it)"
                )

    # -- routing ---------------------------------------------------------------------------
    def connect(self) -> tuple[Connection, _Replica] | None:
        """A connection to the replica reads should use now, or None for the primary."""
        if self._primary_once:
            self._primary_once = False
            return None
        now = time.monotonic()
        for replica in self.replicas:
            if replica.down_until > now:
                continue
            try:
                conn = replica.engine.connect()
            except DBAPIError as exc:
                self._down(replica, f"cannot be reached ({_reason(exc)})")
                continue
            try:
                if self._usable(replica, conn, now):
                    return conn, replica
            except DBAPIError as exc:
                self._down(replica, f"failed ({_reason(exc)})")
            conn.close()
        return None

    def _usable(self, replica: _Replica, conn: Connection, now: float) -> bool:
        if self.max_lag_s is not None and now - replica.lag_checked >= _LAG_EVERY:
            replica.lag_checked = now
            lagging = self._lag_s(conn) > self.max_lag_s
            if lagging and not replica.lagging:
                warnings.warn(
                    f"replica {replica.shown()} is more than max_lag_s={self.max_lag_s} s "
                    "behind the primary; reading from the primary until it catches up",
                    ReplicaWarning,
                    stacklevel=6,
                )
            replica.lagging = lagging
        if replica.lagging:
            return False
        pending = self._pending_lsn
        if pending is None or replica.confirmed == pending:
            return True
        waiting = REPLICA_CATCH_UP.start(self.wait_s)
        replayed = select(func.pg_last_wal_replay_lsn() >= literal(pending).cast(_PgLsn()))
        while True:
            if conn.execute(replayed).scalar():
                conn.rollback()
                replica.confirmed = pending  # per replica: another may be further behind
                return True
            conn.rollback()
            if not waiting.sleep():
                warnings.warn(
                    f"replica {replica.shown()} had not replayed this handle's last write "
                    f"after wait_s={self.wait_s} s; reading from the primary for "
                    f"{self.retry_s} s",
                    ReplicaWarning,
                    stacklevel=6,
                )
                replica.down_until = time.monotonic() + self.retry_s  # do not wait again
                return False

    def _lag_s(self, conn: Connection) -> float:
        """Seconds since the replica last replayed a transaction, when the primary has
        WAL it has not replayed (0 when it has everything)."""
        with self.primary.connect() as primary:
            head = primary.execute(select(func.pg_current_wal_lsn())).scalar_one()
        behind = select(
            func.pg_wal_lsn_diff(literal(str(head)).cast(_PgLsn()), func.pg_last_wal_replay_lsn()),
            func.extract("epoch", func.now() - func.pg_last_xact_replay_timestamp()),
        )
        lag_bytes, seconds = conn.execute(behind).one()
        conn.rollback()
        if lag_bytes is None or float(lag_bytes) <= 0:
            return 0.0
        return float("inf") if seconds is None else float(seconds)

    def wrote(self, conn: Connection) -> None:
        """After a committed write on ``conn`` (the primary): remember its LSN, which the
        next read waits for on a replica (``read_your_writes``)."""
        if not self.read_your_writes:
            return
        lsn = conn.execute(select(func.pg_current_wal_lsn())).scalar_one()
        conn.rollback()
        with self._lock:
            self._pending_lsn = str(lsn)

    def read_primary_once(self) -> None:
        """Send the next read to the primary (a write committed whose position is
        unknown)."""
        self._primary_once = True

    def lost(self, replica: _Replica, exc: BaseException) -> ConnectionLostError:
        """A replica failed in the middle of a read: left for ``retry_s``; the error to
        raise (the caller retries elsewhere)."""
        self._down(replica, f"failed in the middle of a read ({_reason(exc)})")
        return ConnectionLostError(
            f"replica {replica.shown()} was lost in the middle of a read; reads go to the next "
            "replica or the primary. Retry the call"
        )

    def _down(self, replica: _Replica, why: str) -> None:
        fresh = replica.down_until <= time.monotonic()
        replica.down_until = time.monotonic() + self.retry_s
        replica.engine.dispose()
        if fresh:
            warnings.warn(
                f"replica {replica.shown()} {why}; reading from the "
                f"{'next replica' if len(self.replicas) > 1 else 'primary'} for {self.retry_s} s",
                ReplicaWarning,
                stacklevel=6,
            )

    def forked(self) -> None:
        """In a forked process: drop the parent's pooled replica connections."""
        for replica in self.replicas:
            replica.engine.dispose(close=False)

    def close(self) -> None:
        for replica in self.replicas:
            replica.engine.dispose()


class _PgLsn(UserDefinedType[str]):
    """Postgres' ``pg_lsn`` type, for casts only."""

    cache_ok = True

    def get_col_spec(self, **kw: Any) -> str:
        return "pg_lsn"


def _system_id(conn: Connection) -> int:
    control = func.pg_control_system().table_valued("system_identifier")
    value = conn.execute(select(control.c.system_identifier)).scalar_one()
    conn.rollback()
    return int(value)


def _reason(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    return (str(orig or exc).strip().splitlines() or ["unknown error"])[0]
