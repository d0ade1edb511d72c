"""Benchmark: what task summaries cost writers, and what they save ``expstore stats``
(issue: Scale I), measured in one run.

Writes (``writes``), on each backend, two buffers alike, one keeping task summaries
(``buffer.create_summary()``), the other not, written in turn:

- steady state: ``store_batch`` of 64 rows (8 tasks of 8 steps, 2 agents) into a buffer
  full at 20,000 rows (FIFO: each write evicts 64), median of ``--repeats`` writes;
- ``extend`` of 20,000 rows of a vectorised step, every row a task of its own (the worst
  case: a summary row per stored row), median of 5 writes.

Stats (``stats``), on the data sets of ``scale_data.py`` (100k, 1M, 10M small rows, 8 per
task), each figure in a fresh process: ``compute_stats`` (what ``expstore stats`` prints)
reading every row (``--scan-up-to`` rows at most: it takes minutes at 10M), then
``create_summary()`` once (timed), then ``compute_stats`` reading the summaries, with the
process's memory growth. The summaries are dropped again at the end (``--keep`` keeps them).

    python benchmarks/bench_summary.py writes [--backends sqlite,postgres]
    python benchmarks/bench_summary.py stats [--sizes 100000,1000000,10000000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import ms  # noqa: E402
from bench_store import DEFAULT_PG, drop_pg, fresh_pg  # noqa: E402

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer  # noqa: E402


def _batch(write: int, rng: np.random.Generator) -> list[DataRow]:
    return [
        DataRow(
            exp_meta=ExpMeta(
                task_id=f"w{write}-t{t}", agent_id=f"agent{t % 2}", step=s, policy_version=write
            ),
            exp_data=Experience(
                state={"obs": [round(float(x), 3) for x in rng.random(4)]},
                reward_t=float(rng.random()),
            ),
        )
        for t in range(8)
        for s in range(8)
    ]


def _columns(n: int, write: int) -> dict[str, Any]:
    rng = np.random.default_rng(write)
    return {
        "task_id": [f"env{i}-{write}" for i in range(n)],
        "agent_id": "policy",
        "step": 0,
        "state": {"obs": rng.random((n, 16), dtype=np.float32)},
        "reward_t": rng.random(n),
    }


def writes(label: str, url_for: Any, repeats: int) -> dict[str, float]:
    urls = {kind: url_for(kind) for kind in ("plain", "summary")}
    steady = {kind: ReplayBuffer(url, name="steady", capacity=20_000) for kind, url in urls.items()}
    steady["summary"].create_summary()
    rng = np.random.default_rng(0)
    for write in range(20_000 // 64 + 2):  # full, and evicting
        for buffer in steady.values():
            buffer.store_batch(_batch(write, rng))
    times: dict[str, list[float]] = {"plain": [], "summary": []}
    for write in range(repeats):
        batch = _batch(1000 + write, rng)
        order = ("plain", "summary") if write % 2 else ("summary", "plain")
        for kind in order:  # the same rows (ids aside) into each, in turn
            rows = [r.model_copy(update={"id": f"{kind}-{r.id}"}) for r in batch]
            started = time.perf_counter()
            steady[kind].store_batch(rows)
            times[kind].append(time.perf_counter() - started)
    out = {f"steady store 64 ({kind})": ms(t) for kind, t in times.items()}
    assert len(steady["summary"]) == len(steady["plain"]) == 20_000
    wide = {kind: ReplayBuffer(url, name="wide") for kind, url in urls.items()}
    wide["summary"].create_summary()
    times = {"plain": [], "summary": []}
    for write in range(5):
        columns = _columns(20_000, write)
        order = ("plain", "summary") if write % 2 else ("summary", "plain")
        for kind in order:
            started = time.perf_counter()
            wide[kind].extend(columns)
            times[kind].append(time.perf_counter() - started)
    out.update({f"extend 20k, a task per row ({kind})": ms(t) for kind, t in times.items()})
    stats = {kind: wide[kind].sql.summary(None, 0.0) for kind in wide}
    assert stats["plain"]["tasks"] == stats["summary"]["tasks"] == 100_000
    for buffer in (*steady.values(), *wide.values()):
        buffer.close()
    print(f"\n== {label} ==")
    for name, value in out.items():
        print(f"  {name:<44} {value:9.2f} ms")
    for what in ("steady store 64", "extend 20k, a task per row"):
        ratio = out[f"{what} (summary)"] / out[f"{what} (plain)"]
        print(f"  {what}: with summaries / without = {ratio:.2f}x")
    return out


def child(url: str, what: str) -> dict[str, Any]:
    from bench_scale import _rss_mib

    from expstore.cli.stats import compute_stats

    before = _rss_mib()
    started = time.perf_counter()
    with ReplayBuffer(url, name="scale") as buffer:
        if what == "drop":
            buffer.drop_summary()
        elif what == "create":
            buffer.create_summary()
            assert buffer.sql.summary_tasks() > 0
        else:
            kept = buffer.sql.summary_state()
            assert (kept is not None) == (what == "stats:summary"), kept
            stats = compute_stats(buffer)
            assert stats["rows"] > 0
    return {"seconds": time.perf_counter() - started, "rss": _rss_mib() - before}


def _run_child(url: str, what: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "child", url, what], capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise SystemExit(f"child {what} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def stats(
    backend: str, sizes: list[int], scratch: Path, pg_url: str, scan_up_to: int, keep: bool
) -> None:
    from scale_data import built, dataset_url

    print(f"\n== {backend}: expstore stats ==")
    print(f"{'rows':>12}{'every row s':>14}{'create s':>11}{'summaries s':>14}{'RSS MiB':>9}")
    for n in sizes:
        url = built(dataset_url(backend, n, scratch, pg_url), n)
        _run_child(url, "drop")
        scan = _run_child(url, "stats:rows")["seconds"] if n <= scan_up_to else float("nan")
        create = _run_child(url, "create")["seconds"]
        read = _run_child(url, "stats:summary")
        if not keep:
            _run_child(url, "drop")
        print(f"{n:>12,}{scan:>14.2f}{create:>11.1f}{read['seconds']:>14.3f}{read['rss']:>9.1f}")


def main() -> None:
    if sys.argv[1:2] == ["child"]:
        print(json.dumps(child(sys.argv[2], sys.argv[3])))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=["writes", "stats"])
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--pg", default=DEFAULT_PG)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--sizes", default="100000,1000000,10000000")
    parser.add_argument("--scratch", type=Path, default=Path("/work/scratch"))
    parser.add_argument("--scan-up-to", type=int, default=10_000_000)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    for backend in args.backends.split(","):
        if args.part == "stats":
            sizes = [int(s) for s in args.sizes.split(",")]
            stats(backend, sizes, args.scratch, args.pg, args.scan_up_to, args.keep)
            continue
        if backend == "sqlite":
            with tempfile.TemporaryDirectory() as tmp:
                writes("sqlite", lambda kind: f"sqlite:///{tmp}/{kind}.db", args.repeats)
        else:
            made: list[object] = []
            try:
                writes("postgres", _pg_databases(args.pg, made), args.repeats)
            finally:
                for handle in made:
                    drop_pg(handle)


def _pg_databases(server: str, made: list[object]) -> Any:
    """A function giving a fresh database's URL per call (each noted in ``made``)."""

    def url_for(kind: str) -> str:
        url, handle = fresh_pg(server)
        made.append(handle)
        return url

    return url_for


if __name__ == "__main__":
    main()
