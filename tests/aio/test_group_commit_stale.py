"""Group commit vs sequential with eviction "stale" evicting a write's own (newest) rows,
then another write in the same transaction (SQLite's keyed insert path): same reports,
same lineage, and keys never reused. (A check; expected to pass.)"""

from __future__ import annotations

from typing import Any

import numpy as np

from expstore import ReplayBuffer


def _cols(prefix: str, n: int, version: int) -> dict[str, Any]:
    return {
        "id": [f"{prefix}{i}" for i in range(n)],
        "task_id": prefix,
        "agent_id": "a",
        "step": list(range(n)),
        "policy_version": version,
        "reward_t": np.ones(n),
    }


def _writes() -> list[tuple[str, Any, Any]]:
    return [
        ("extend", _cols("ok", 3, 5), None),
        ("extend", _cols("old", 3, 1), None),
        ("extend", _cols("new", 2, 5), None),
        ("extend", _cols("old2", 2, 0), None),
        ("extend", _cols("last", 2, 5), None),
    ]


def _state(b: ReplayBuffer) -> Any:
    ids = [i for _, c, _ in _writes() for i in c["id"]]
    keys = [(r.id) for r in b.query()]
    with b.sql.handle.read() as conn:
        from sqlalchemy import select

        from expstore.db.schema import rows

        ks = [
            k
            for (k,) in conn.execute(
                select(rows.c.key)
                .where(rows.c.buffer_id == b.sql.handle.buffer_id)
                .order_by(rows.c.key)
            )
        ]
    return keys, {i: line.state for i, line in b.lineage(ids).items()}, len(b), ks


def test_stale_then_more(db_url: str, buffer_name: str) -> None:
    with (
        ReplayBuffer(db_url, name=buffer_name + "_seq") as seq,
        ReplayBuffer(db_url, name=buffer_name + "_grp") as grp,
    ):
        for b in (seq, grp):
            b.set_policy_version(5)
            b.set_retention(None, "stale", stale_after=1)
        one = [seq.sql.extend(d, dedup=x, report=True) for _, d, x in _writes()]
        together = grp.sql.write_together(_writes())
        assert together == one
        s, g = _state(seq), _state(grp)
        assert s[:3] == g[:3]
        base_s, base_g = s[3][0], g[3][0]
        assert [k - base_s for k in s[3]] == [k - base_g for k in g[3]]
