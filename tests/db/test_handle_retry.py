"""A write the server rolled back for a serialisation failure or a deadlock is retried;
any other failure reaches the caller at once."""

from __future__ import annotations

import pytest

from expstore import ReplayBuffer, StorageError
from expstore._retry import CONFLICT
from expstore.storage import writer
from tests.helpers import make_rows


class _Orig(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


class _Driver(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(sqlstate)
        self.orig = _Orig(sqlstate)


def _failing(times: int, sqlstate: str, real):  # noqa: ANN001, ANN202
    calls = {"n": 0}

    def write(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls["n"] += 1
        if calls["n"] <= times:
            raise StorageError("could not store rows: conflict") from _Driver(sqlstate)
        return real(*args, **kwargs)

    return write, calls


@pytest.mark.parametrize("sqlstate", ["40001", "40P01"])
def test_conflicts_are_retried_and_the_rows_land_once(
    db_url: str, buffer_name: str, monkeypatch: pytest.MonkeyPatch, sqlstate: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        write, calls = _failing(2, sqlstate, writer._write)
        monkeypatch.setattr(writer, "_write", write)
        assert buffer.store_batch(make_rows(5)) == 5
        assert calls["n"] == 3 and len(buffer) == 5


def test_other_failures_and_endless_conflicts_reach_the_caller(
    db_url: str, buffer_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        write, calls = _failing(1, "23505", writer._write)
        monkeypatch.setattr(writer, "_write", write)
        with pytest.raises(StorageError, match="conflict"):
            buffer.store_batch(make_rows(2))
        assert calls["n"] == 1
        write, calls = _failing(100, "40001", writer._write)
        monkeypatch.setattr(writer, "_write", write)
        with pytest.raises(StorageError):
            buffer.store_batch(make_rows(2))
        assert calls["n"] == CONFLICT.attempts + 1 and len(buffer) == 0


@pytest.mark.parametrize("sqlstate", ["40P01", "23503"])
def test_counting_draws_retries_a_deadlock_or_a_row_deleted_meanwhile(
    db_url: str, buffer_name: str, monkeypatch: pytest.MonkeyPatch, sqlstate: str
) -> None:
    """consume_after's counts: a deadlock with a writer evicting the counted rows, or a row
    deleted between the existence check and the foreign key's, is counted again."""
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(make_rows(5))
        keys = buffer.storage.key_index(None)["key"]
        own = buffer.sql.handle
        write, calls = _failing(2, sqlstate, own.write)
        monkeypatch.setattr(own, "write", write)
        assert buffer.storage.count_draws(keys, 1).tolist() == keys.tolist()
        assert calls["n"] == 3
        write, calls = _failing(1, "23505", own.write)
        monkeypatch.setattr(own, "write", write)
        with pytest.raises(StorageError, match="conflict"):
            buffer.storage.count_draws(keys, 2)
        assert calls["n"] == 1
