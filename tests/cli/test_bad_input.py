"""The CLI's side of the bad-input catalogue: a one-line error, a non-zero exit, nothing
stored changed."""

from __future__ import annotations

from typing import Any

import pytest

from expstore import ReplayBuffer
from tests.helpers import make_rows


@pytest.mark.parametrize(
    "args",
    [
        ["sample", "--batch-size", "0"],
        ["sample", "--sampler", "nosuch"],
        ["query", "-w", "step ==== 1"],
        ["query", "-w", "exp_data.state.x > 'a' and"],
        ["query", "--limit", "-1"],
        ["import", "no-such-file.jsonl"],
        ["export", "out.xlsx"],
        ["stats", "--by", "nosuch"],
    ],
    ids=lambda a: " ".join(a),
)
def test_cli_bad_input_is_a_one_line_error(invoke: Any, tmp_path: Any, args: list[str]) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    with ReplayBuffer(url) as buffer:
        buffer.store_batch(make_rows(4))
    result = invoke(*args[:1], "--db", url, *args[1:])
    assert result.exit_code != 0
    assert "unexpected" not in result.stderr and "Traceback" not in result.stderr
    with ReplayBuffer(url) as buffer:
        assert len(buffer) == 4
