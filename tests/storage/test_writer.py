"""Rows changed after they were built are checked again when stored: a bad value is refused
with a ValidationError naming the field, and nothing of the batch is stored."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from expstore import (
    ExpstoreError,
    ReplayBuffer,
    RowValidationError,
    StoreReport,
    UnsupportedTypeError,
)
from expstore.storage.writer import WRITE_CHUNK
from tests.helpers import make_row, make_rows

CHANGES: list[tuple[str, str, Any, str]] = [
    # (model, field, value, what the error names)
    ("exp_meta", "step", -1, "greater than or equal to 0"),
    ("exp_meta", "step", "abc", "valid integer"),
    ("exp_meta", "step", 2**63, "less than or equal to"),
    ("exp_meta", "task_id", "", "at least 1 character"),
    ("exp_meta", "task_id", "t" * 256, "at most 255 characters"),
    ("exp_meta", "agent_id", "a\x00b", "NUL"),
    ("exp_meta", "agent_id", None, "valid string"),
    ("exp_meta", "pre_agent", "\ud800", "valid string"),
    ("exp_meta", "execute_time", float("inf"), "finite number"),
    ("exp_data", "reward_t", float("nan"), "finite number"),
    ("exp_data", "reward_t", "high", "valid number"),
    ("exp_data", "v_t", float("-inf"), "finite number"),
    ("exp_data", "done", "yes please", "valid boolean"),
    ("exp_data", "messages", "not a list", "valid list"),
    ("exp_data", "ext_info", ["not", "a", "dict"], "valid dictionary"),
]


def _change(row: Any, owner: str, field: str, value: Any) -> None:
    setattr(getattr(row, owner), field, value)  # pydantic does not check assignments


@pytest.mark.parametrize(("owner", "field", "value", "message"), CHANGES)
def test_a_changed_row_is_refused_naming_the_field_and_nothing_is_stored(
    db_url: str, buffer_name: str, owner: str, field: str, value: Any, message: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(make_rows(3))
        rows = make_rows(WRITE_CHUNK + 20)
        bad = rows[WRITE_CHUNK + 7]  # in the second chunk: the first was already sent
        _change(bad, owner, field, value)
        with pytest.raises(RowValidationError) as caught:
            buffer.store_batch(rows)
        error = caught.value
        assert isinstance(error, ValidationError) and isinstance(error, ExpstoreError)
        assert [e["loc"] for e in error.errors()] == [(owner, field)]
        text = str(error)
        assert bad.id in text and f"{owner}.{field}" in text and message in text
        assert "Nothing of the batch was stored" in text
        assert len(buffer) == 3
        with pytest.raises(RowValidationError):
            buffer.store(bad)
        assert len(buffer) == 3


def test_a_changed_row_that_is_still_valid_is_stored_as_its_model_reads_it(
    db_url: str, buffer_name: str
) -> None:
    """A value the bulk check cannot vouch for, but the model accepts, is stored as the
    model makes it (an int reward is a float, a numpy int step an int)."""
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        row = make_row(step=1, reward=0.5)
        row.exp_data.reward_t = 2  # type: ignore[assignment]
        row.exp_meta.step = np.int64(4)  # type: ignore[assignment]
        buffer.store(row)
        (back,) = buffer.query()
        assert back.exp_data.reward_t == 2.0 and isinstance(back.exp_data.reward_t, float)
        assert back.exp_meta.step == 4 and type(back.exp_meta.step) is int


def test_rows_made_without_validation_are_checked_too(db_url: str, buffer_name: str) -> None:
    from expstore import DataRow, Experience, ExpMeta

    meta = ExpMeta.model_construct(task_id="t", agent_id="a", step=-5, execute_time=1.0)
    row = DataRow(exp_meta=ExpMeta(task_id="t", agent_id="a", step=0), exp_data=Experience())
    row.exp_meta = meta  # pydantic keeps an instance as it is
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        with pytest.raises(RowValidationError, match="exp_meta.step"):
            buffer.store(row)
        assert len(buffer) == 0


# -- what a write reports (store_batch(..., report=True)) --------------------------------


def test_a_group_already_stale_is_reported_stored_and_evicted_at_once(
    db_url: str, buffer_name: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.set_retention(None, "stale", stale_after=2)
        buffer.set_policy_version(10)
        late = [make_row("g", "actor", i, version=7) for i in range(8)]
        done = buffer.store_batch(late, report=True)
        assert done == StoreReport(8, 0, 0, 8, 8)
        assert (done.kept, done.evicted, len(buffer)) == (0, 8, 0)
        assert {r.state for r in buffer.lineage([r.id for r in late]).values()} == {"evicted"}
        fresh = [make_row("g2", "actor", i, version=9) for i in range(8)]
        assert buffer.store_batch(fresh) == 8  # the int return is unchanged
        assert len(buffer) == 8


def test_a_report_counts_duplicates_and_capacity_evictions_old_and_own(
    db_url: str, buffer_name: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name, capacity=5) as buffer:
        first = make_rows(4)
        assert buffer.store_batch(first, report=True) == StoreReport(4)
        done = buffer.store_batch(make_rows(7), dedup="skip", report=True)
        # its first 4 rows repeat the content stored: 4 duplicates left out, 3 stored,
        # and 2 of the first rows go beyond the capacity
        assert done == StoreReport(3, 4, 2, 0, 0)
        big = buffer.store_batch(make_rows(8), report=True)
        # a batch larger than the capacity: every old row goes, and 3 of its own
        assert (big.stored, big.evicted_capacity, big.evicted_at_once, big.kept) == (8, 8, 3, 5)
        assert len(buffer) == 5


def test_extend_reports_too(db_url: str, buffer_name: str) -> None:
    with ReplayBuffer(db_url, name=buffer_name, capacity=3) as buffer:
        columns = {"task_id": ["a", "b", "c", "d"], "agent_id": "x", "step": 0}
        assert buffer.extend(columns, report=True) == StoreReport(4, 0, 1, 0, 1)
        assert buffer.extend(columns) == 4


def test_report_must_be_a_bool_and_a_refused_call_stores_nothing() -> None:
    with ReplayBuffer() as buffer:
        with pytest.raises(UnsupportedTypeError, match="report must be True or False"):
            buffer.store_batch(make_rows(2), report="yes")  # type: ignore[call-overload]
        assert len(buffer) == 0
