"""Rows changed after they were built are checked again when stored: a bad value is refused
with a ValidationError naming the field, and nothing of the batch is stored."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from expstore import ExpstoreError, ReplayBuffer, RowValidationError
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
