"""--where "changed(...)": the CLI's filter language compares steps with the previous one."""

from __future__ import annotations

import json

import numpy as np

from expstore import ReplayBuffer
from tests.cli.conftest import Invoke
from tests.helpers import make_row

PAGES = [np.full((128, 256, 3), shade, np.uint8) for shade in (10, 200)]


def test_query_where_unchanged_lists_the_steps_that_left_the_page(
    invoke: Invoke, db_url: str, buffer_name: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(
            [
                make_row("t", "a", step, state={"screen": PAGES[p]})
                for step, p in enumerate([0, 0, 1, 1, 1])
            ]
        )
    where = "unchanged(exp_data.state.screen) and task_id = 't'"
    result = invoke("query", "--db", db_url, "-b", buffer_name, "--where", where, "--json")
    assert result.exit_code == 0, result.stderr
    assert [json.loads(line)["exp_meta"]["step"] for line in result.stdout.splitlines()] == [
        1,
        3,
        4,
    ]
    bad = invoke("query", "--db", db_url, "-b", buffer_name, "--where", "changed(exp_data.state")
    assert bad.exit_code != 0 and "after the field of changed" in bad.stderr
