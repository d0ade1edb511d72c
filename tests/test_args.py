"""Out-of-range numbers and text no database can hold are refused with typed errors that
say what is accepted, before anything touches the database, on both backends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from expstore import ExpstoreError, ReplayBuffer
from expstore.errors import InvalidArgumentError, UnsupportedTypeError
from tests.helpers import make_rows


@pytest.fixture
def buf(db_url: str, buffer_name: str) -> Iterator[ReplayBuffer]:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(make_rows(6))
        yield buffer


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


CASES: list[tuple[str, Callable[[ReplayBuffer], Any], type[ExpstoreError], str]] = [
    ("huge batch", lambda b: b.sample(batch_size=10**12), InvalidArgumentError, "<= 10,000,000"),
    ("batch 2**63", lambda b: b.sample(batch_size=2**63), InvalidArgumentError, "batch_size"),
    (
        "huge claim",
        lambda b: b.claim(10**12, consumer="c"),
        InvalidArgumentError,
        "batch_size must",
    ),
    ("capacity 1e30", lambda b: b.set_retention(10**30), InvalidArgumentError, "capacity"),
    ("surrogate id", lambda b: b.get("\ud800"), InvalidArgumentError, "surrogates"),
    ("NUL id", lambda b: b.get("a\x00"), InvalidArgumentError, "NUL"),
    ("int id", lambda b: b.get(5), UnsupportedTypeError, "row_id must be a str"),
    ("int task id", lambda b: b.get_by_task_id(5), UnsupportedTypeError, "task_id must be"),
    ("int task ids", lambda b: b.get_batch_by_task_ids([5]), UnsupportedTypeError, "task id"),
    ("surrogate consumer", lambda b: b.checkpoint("\ud800"), InvalidArgumentError, "consumer"),
    ("surrogate lineage", lambda b: b.lineage(["\udfff"]), InvalidArgumentError, "id:"),
    ("order_by 5", lambda b: list(b.query(order_by=5)), UnsupportedTypeError, "order_by"),
    ("sampler as text", lambda b: b.sample("uniform"), UnsupportedTypeError, "a sampler is"),
    (
        "priorities as text",
        lambda b: b.update_priorities(["x"], ["high"]),
        UnsupportedTypeError,
        "priorities must be numbers",
    ),
    # Issue 32: ints beyond a float's range raised a bare OverflowError.
    (
        "lease 10**400",
        lambda b: b.claim(1, consumer="c", lease_s=10**400),
        InvalidArgumentError,
        "lease_s must be a finite number of seconds > 0, got an int of about 401 digits",
    ),
    (
        "wait 10**400",
        lambda b: b.claim(1, consumer="c", wait_s=10**400),
        InvalidArgumentError,
        "wait_s must be a number of seconds >= 0",
    ),
    (
        "renew 10**400",
        lambda b: b.claim(1, consumer="c").renew(10**400),
        InvalidArgumentError,
        "lease_s must be a finite number",
    ),
    (
        "wait_for timeout 10**400",
        lambda b: b.wait_for(1, timeout_s=10**400),
        InvalidArgumentError,
        "timeout_s must be a number of seconds >= 0",
    ),
    (
        "wait_for timeout -inf",
        lambda b: b.wait_for(1, timeout_s=float("-inf")),
        InvalidArgumentError,
        "timeout_s must be a number of seconds >= 0",
    ),
    ("lineage None", lambda b: b.lineage(None), UnsupportedTypeError, "a list of ids"),
    ("lineage 5", lambda b: b.lineage(5), UnsupportedTypeError, "got int 5"),
    (
        "checkpoint 1100 deep",
        lambda b: b.claim(1, consumer="c").ack(checkpoint=_nested(1_100)),
        InvalidArgumentError,
        "nest more than 100 levels deep in the checkpoint",
    ),
]


@pytest.mark.parametrize(("what", "call", "error", "match"), CASES, ids=[c[0] for c in CASES])
def test_bad_arguments_raise_typed_errors_and_change_nothing(
    buf: ReplayBuffer, what: str, call: Any, error: type, match: str
) -> None:
    before = sorted(r.id for r in buf.query())
    with pytest.raises(error, match=match):
        call(buf)
    assert sorted(r.id for r in buf.query()) == before


@pytest.mark.parametrize("name", ["\ud800", "a\x00b"])
def test_buffer_names_no_database_can_store_are_refused(db_url: str, name: str) -> None:
    with pytest.raises(InvalidArgumentError, match="name"):
        ReplayBuffer(db_url, name=name)


def test_a_task_named_like_a_number_is_found_by_its_name(buf: ReplayBuffer) -> None:
    from expstore import DataRow, Experience, ExpMeta

    buf.store(DataRow(exp_meta=ExpMeta(task_id="5", agent_id="a", step=0), exp_data=Experience()))
    assert [r.exp_meta.task_id for r in buf.get_by_task_id("5")] == ["5"]
    assert list(buf.get_batch_by_task_ids(["5"])) == ["5"]
