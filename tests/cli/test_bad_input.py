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


def test_importing_a_line_nested_5000_deep_is_a_one_line_depth_error(
    invoke: Any, tmp_path: Any
) -> None:
    """Issue 32: it ended in "unexpected RecursionError ... please report it"."""
    url = f"sqlite:///{tmp_path / 'c.db'}"
    with ReplayBuffer(url) as buffer:
        buffer.store_batch(make_rows(4))
    deep = "[" * 5_000 + "]" * 5_000
    line = '{"id": "x", "task_id": "t", "agent_id": "a", "step": 0, "data": {"state": %s}}'
    (tmp_path / "deep.jsonl").write_text(line % deep + "\n")
    result = invoke("import", "--db", url, str(tmp_path / "deep.jsonl"))
    assert result.exit_code != 0
    assert "unexpected" not in result.stderr and "Traceback" not in result.stderr
    assert "nest too deep to read" in result.stderr and "at most 200 levels" in result.stderr
    with ReplayBuffer(url) as buffer:
        assert len(buffer) == 4
