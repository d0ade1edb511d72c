"""Errors say what was expected, what arrived and what to do, under one root."""

from __future__ import annotations

import pytest

from expstore import (
    CodecError,
    EmptyBufferError,
    ExpstoreError,
    QueryError,
    ReplayBuffer,
    SchemaVersionError,
    StorageError,
)
from expstore.errors import MissingDependencyError
from tests.helpers import make_row


@pytest.mark.parametrize(
    "error",
    [
        CodecError,
        SchemaVersionError,
        StorageError,
        QueryError,
        EmptyBufferError,
        MissingDependencyError,
    ],
)
def test_every_error_is_an_expstore_error(error: type[Exception]) -> None:
    assert issubclass(error, ExpstoreError)
    assert error.__doc__


def test_query_and_empty_buffer_errors_are_value_errors() -> None:
    assert issubclass(QueryError, ValueError)
    assert issubclass(EmptyBufferError, ValueError)


def test_a_malformed_url_says_what_urls_look_like() -> None:
    with pytest.raises(StorageError, match=r"expected a database URL such as sqlite:///path\.db"):
        ReplayBuffer("::not a url::")


def test_an_unsupported_backend_is_named() -> None:
    with pytest.raises(StorageError, match="SQLite or PostgreSQL, got a 'mysql' URL"):
        ReplayBuffer("mysql://root@127.0.0.1/test")


def test_an_unreachable_server_is_a_storage_error_without_the_password() -> None:
    with pytest.raises(StorageError, match="could not open") as info:
        ReplayBuffer("postgresql+psycopg://someone:s3cret@127.0.0.1:1/db")
    assert "s3cret" not in str(info.value)
    assert "reachable" in str(info.value)


def test_a_missing_sqlite_folder_is_a_storage_error(tmp_path) -> None:
    with pytest.raises(StorageError, match="could not open"):
        ReplayBuffer(f"sqlite:///{tmp_path / 'missing' / 'x.db'}")


def test_bad_options_are_refused_up_front() -> None:
    with pytest.raises(ValueError, match="capacity must be None or an int >= 1"):
        ReplayBuffer(capacity=0)
    with pytest.raises(ValueError, match="eviction must be one of"):
        ReplayBuffer(eviction="lifo")
    with pytest.raises(TypeError, match="expects None, a database URL or a Storage"):
        ReplayBuffer(42)  # type: ignore[arg-type]


def test_codec_errors_name_the_row_and_the_path() -> None:
    buf = ReplayBuffer()
    row = make_row()
    row.exp_data.ext_info = {"x": [1, object()]}
    with pytest.raises(CodecError, match=rf"row {row.id}: ext_info\.x\[1\]: cannot store"):
        buf.store(row)
    assert len(buf) == 0


def test_delete_without_a_condition_points_to_clear() -> None:
    with pytest.raises(ValueError, match="call clear"):
        ReplayBuffer().delete(None)
