"""SqlStorage.write_together of several writes leaves the buffer exactly as the same
writes one after the other: reports, rows kept (in key order), tombstones and lineage,
arrays stored once, counters. (Expected to pass: a check, not a defect.)"""

from __future__ import annotations

from typing import Any

import numpy as np

from expstore import ReplayBuffer

BIG = np.arange(20_000, dtype=np.float32)  # 80 KB: stored once by digest


def _cols(task: str, n: int, prefix: str, big: bool = False) -> dict[str, Any]:
    cols: dict[str, Any] = {
        "id": [f"{prefix}{i}" for i in range(n)],
        "task_id": task,
        "agent_id": "a",
        "step": list(range(n)),
        "reward_t": np.ones(n),
    }
    if big:
        cols["state"] = {"big": np.stack([BIG] * n)}
    return cols


def _writes() -> list[tuple[str, Any, Any]]:
    from tests.helpers import make_row

    rows = [make_row("r", "a", i).model_copy(update={"id": f"r{i}"}) for i in range(3)]
    same = [make_row("r", "a", i).model_copy(update={"id": f"s{i}"}) for i in range(3)]
    return [
        ("extend", _cols("a", 4, "a", big=True), None),
        ("extend", {**_cols("a", 4, "x", big=True)}, "skip"),  # same content as the first
        ("store_batch", rows, None),
        ("store_batch", same, "skip"),  # same content as the rows before
        ("extend", _cols("b", 6, "b"), None),  # beyond capacity 8: the oldest go
        ("extend", _cols("c", 2, "c", big=True), None),
    ]


def _state(buffer: ReplayBuffer, ids: list[str]) -> Any:
    kept = [r.id for r in buffer.query()]
    lineage = {
        i: (line.state, getattr(line, "reason", None)) for i, line in buffer.lineage(ids).items()
    }
    from sqlalchemy import select

    from expstore.db.schema import buffers

    with buffer.sql.handle.read() as conn:
        b = conn.execute(
            select(buffers.c.inserted, buffers.c.row_count).where(
                buffers.c.id == buffer.sql.handle.buffer_id
            )
        ).one()
    return kept, lineage, buffer.array_stats(), len(buffer), tuple(b)


def test_group_equals_sequential(db_url: str, buffer_name: str) -> None:
    ids = [
        f"{p}{i}"
        for p, n in (("a", 4), ("x", 4), ("r", 3), ("s", 3), ("b", 6), ("c", 2))
        for i in range(n)
    ]
    with (
        ReplayBuffer(db_url, name=buffer_name + "_seq", capacity=8) as seq,
        ReplayBuffer(db_url, name=buffer_name + "_grp", capacity=8) as grp,
    ):
        one = []
        for kind, data, dedup in _writes():
            one.append(getattr(seq.sql, kind)(data, dedup=dedup, report=True))
        together = grp.sql.write_together(_writes())
        assert together == one
        assert _state(grp, ids) == _state(seq, ids)
