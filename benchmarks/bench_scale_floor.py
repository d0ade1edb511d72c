"""Benchmark: how the warm figures grow from 100k to 10M rows, against the same work done
by hand on the driver's own connection (the floor), measured in the same processes.

The Scale I issue asks that a warm ``sample(256)`` and ``update_priorities(256)`` at 10M rows
cost at most 1.3x their figures at 100k. This script measures what the database itself
charges for the same work at both sizes, with no expstore code in between, so that each
expstore ratio can be read against the ratio of its floor:

- ``uniform``: expstore ``sample(256)`` with ``UniformSampler``, against 256 random keys of
  the (dense) key range fetched whole by one ``SELECT * ... WHERE key IN (...)``;
- ``by agent``: expstore ``sample(256)`` under ``agent_id == "agent3"`` (10% of the rows),
  against probing as many random candidate keys as expstore probed (``keys_probed`` per
  sample, read from the same process) with one
  ``SELECT key ... WHERE buffer_id = ? AND agent_id = ? AND key IN (...)``, then fetching
  256 of the matches whole;
- ``update``: expstore ``update_priorities(256)`` on the ids of a new prioritized batch,
  against the statements that update does, on the keys of another new prioritized batch
  (the same kind of rows, so the same pages to write; no id lookup): one upsert of the
  priorities, the buffer's priority version bumped, the update logged, the log trimmed,
  and the commit.

For each size a fresh process runs the expstore call and its floor round-robin (so that
both meet the same cache), ``--repeats`` times each, after a read of the data set into the
page cache; sizes take turns over ``--rounds`` and each figure is the median over them.
The data sets are those of ``scale_data.py`` (built once). Usage::

    python benchmarks/bench_scale_floor.py --backends sqlite --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

BATCH = 256
CASES = ("uniform", "by agent", "update")


class Floor:
    """The work of each case on a raw DB-API connection to the same database."""

    def __init__(self, url: str, buffer_id: int) -> None:
        from expstore.db.engine import create_sql_engine

        engine = create_sql_engine(url)
        self.sqlite = engine.dialect.name == "sqlite"
        self.connection = engine.raw_connection()
        self.buffer_id = buffer_id
        self.mark = "?" if self.sqlite else "%s"
        cursor = self.connection.cursor()
        cursor.execute(
            f"SELECT min(key), max(key) FROM expstore_rows WHERE buffer_id = {self.mark}",
            (buffer_id,),
        )
        self.low, self.high = cursor.fetchone()
        self.connection.commit()

    def _keys(self, rng: Any, count: int) -> list[int]:
        return [int(k) for k in rng.integers(self.low, self.high + 1, count)]

    def _in(self, keys: list[int]) -> tuple[str, list[Any]]:
        if self.sqlite:
            return f"key IN ({', '.join('?' * len(keys))})", list(keys)
        return "key = ANY(%s)", [keys]

    def fetch(self, keys: list[int]) -> list[Any]:
        where, params = self._in(list(dict.fromkeys(keys)))
        cursor = self.connection.cursor()
        cursor.execute(f"SELECT * FROM expstore_rows WHERE {where}", params)
        out = cursor.fetchall()
        self.connection.commit()
        return out

    def uniform(self, rng: Any) -> Any:
        return self.fetch(self._keys(rng, BATCH))

    def by_agent(self, rng: Any, candidates: int) -> Any:
        where, params = self._in(sorted(set(self._keys(rng, candidates))))
        cursor = self.connection.cursor()
        cursor.execute(
            f"SELECT key FROM expstore_rows WHERE buffer_id = {self.mark} "
            f"AND agent_id = {self.mark} AND {where}",
            [self.buffer_id, "agent3", *params],
        )
        found = [r[0] for r in cursor.fetchall()]
        chosen = [found[i] for i in rng.integers(0, len(found), BATCH)]
        return self.fetch(chosen)

    def update(self, rng: Any, keys: list[int]) -> None:
        values = [float(v) for v in rng.random(len(keys)) * 5]
        m, b = self.mark, self.buffer_id
        cursor = self.connection.cursor()
        if self.sqlite:
            cursor.execute("BEGIN IMMEDIATE")
            given = "SELECT value ->> 0 AS k, value ->> 1 AS v FROM json_each(?)"
            params: list[Any] = [json.dumps([[k, v] for k, v in zip(keys, values, strict=True)])]
        else:
            given = "SELECT * FROM unnest(%s::bigint[], %s::float8[]) AS g(k, v)"
            params = [keys, values]
        cursor.execute(
            f"INSERT INTO expstore_priorities (key, buffer_id, priority) "
            f"SELECT k, {b}, v FROM ({given}) AS given WHERE true "
            "ON CONFLICT (key) DO UPDATE SET priority = excluded.priority",
            params,
        )
        cursor.execute(
            "UPDATE expstore_buffers SET priority_version = priority_version + 1 "
            f"WHERE id = {m} RETURNING priority_version",
            (b,),
        )
        seq = cursor.fetchone()[0]
        cursor.execute(
            "INSERT INTO expstore_priority_log (buffer_id, seq, key, priority) "
            f"SELECT {b}, {seq}, k, v FROM ({given}) AS given WHERE true "
            "ON CONFLICT DO NOTHING",
            params,
        )
        cursor.execute(
            f"DELETE FROM expstore_priority_log WHERE buffer_id = {m} AND seq <= {m}",
            (b, seq - 64),
        )
        if self.sqlite:
            cursor.execute("COMMIT")
        else:
            self.connection.commit()

    def close(self) -> None:
        self.connection.close()


def child(url: str, repeats: int) -> dict[str, float]:
    """Medians, seconds, of each case's expstore call and floor in this process."""
    import numpy as np

    from expstore import ReplayBuffer
    from expstore.query import QueryBuilder
    from expstore.samplers import PrioritizedSampler, UniformSampler

    rng = np.random.default_rng(0)
    agent3 = QueryBuilder().eq("exp_meta.agent_id", "agent3").build()
    with ReplayBuffer(url, name="scale") as buffer:
        uniform, by_agent = UniformSampler(seed=0), UniformSampler(seed=1)
        prioritized = PrioritizedSampler(seed=0)
        spaces = buffer.storage.spaces  # type: ignore[attr-defined]
        floor = Floor(url, buffer.storage._handle.buffer_id)  # type: ignore[attr-defined]
        # warm both sides, and learn how many candidates expstore probes per filtered draw
        for _ in range(3):
            buffer.sample(uniform, batch_size=BATCH)
            buffer.sample(by_agent, agent3, batch_size=BATCH)
        probed = spaces.keys_probed
        for _ in range(10):
            buffer.sample(by_agent, agent3, batch_size=BATCH)
        candidates = max(BATCH, (spaces.keys_probed - probed) // 10)

        def update() -> None:
            buffer.sample(prioritized, batch_size=BATCH)
            ids = list(prioritized.last_ids)
            started = time.perf_counter()
            buffer.update_priorities(ids, rng.random(len(ids)) * 5)
            times["update"].append(time.perf_counter() - started)

        def update_floor() -> None:  # the same rows' keys: the same pages to write
            buffer.sample(prioritized, batch_size=BATCH)
            keys = [int(k) for k in dict.fromkeys(prioritized.last_keys.tolist())]
            started = time.perf_counter()
            floor.update(rng, keys)
            times["update floor"].append(time.perf_counter() - started)

        def timed(name: str, fn: Any) -> None:
            started = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - started)

        calls = {
            "uniform": lambda: timed("uniform", lambda: buffer.sample(uniform, batch_size=BATCH)),
            "uniform floor": lambda: timed("uniform floor", lambda: floor.uniform(rng)),
            "by agent": lambda: timed(
                "by agent", lambda: buffer.sample(by_agent, agent3, batch_size=BATCH)
            ),
            "by agent floor": lambda: timed(
                "by agent floor", lambda: floor.by_agent(rng, candidates)
            ),
            "update": update,
            "update floor": update_floor,
        }
        times: dict[str, list[float]] = {name: [] for name in calls}
        for name in calls:  # a first call each, not timed
            calls[name]()
        times = {name: [] for name in calls}
        order = list(calls)
        for r in range(repeats):
            for name in order[r % len(order) :] + order[: r % len(order)]:
                calls[name]()
        floor.close()
    out = {name: statistics.median(t) for name, t in times.items()}
    out["candidates"] = candidates
    return out


def main() -> None:
    from bench_scale import ensure_priorities, prewarm
    from scale_data import built, dataset_url

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100000,10000000")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--scratch", type=Path, default=Path("/work/scratch"))
    parser.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]))))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    for backend in args.backends.split(","):
        urls = {n: built(dataset_url(backend, n, args.scratch, args.pg_url), n) for n in sizes}
        for n, url in urls.items():
            ensure_priorities(url)
            print(f"{backend} {n:,}: read into the page cache in {prewarm(url):.1f} s")
        runs: dict[int, list[dict[str, float]]] = {n: [] for n in sizes}
        for _ in range(args.rounds):
            for n, url in urls.items():
                done = subprocess.run(
                    [sys.executable, __file__, "--child", url, str(args.repeats)],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if done.returncode:
                    raise SystemExit(f"child failed:\n{done.stderr[-3000:]}")
                runs[n].append(json.loads(done.stdout.strip().splitlines()[-1]))
        medians = {
            n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in runs.items()
        }
        small, large = medians[sizes[0]], medians[sizes[-1]]
        print(f"\n{backend}: ms, median of {args.rounds} rounds of {args.repeats}")
        print(f"{'case':<16}" + "".join(f"{f'{n:,}':>12}" for n in sizes) + f"{'ratio':>9}")
        for case in CASES:
            for name in (case, f"{case} floor"):
                cells = "".join(f"{medians[n][name] * 1e3:>12.2f}" for n in sizes)
                print(f"{name:<16}{cells}{large[name] / small[name]:>8.2f}x")
        print(
            "candidates probed per filtered draw: "
            + ", ".join(f"{medians[n]['candidates']:,.0f}" for n in sizes)
        )
        for case in CASES:
            ours = large[case] / small[case]
            bound = large[f"{case} floor"] / small[f"{case} floor"]
            print(f"  {case}: expstore {ours:.2f}x, its floor {bound:.2f}x")


if __name__ == "__main__":
    main()
