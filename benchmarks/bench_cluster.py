"""Benchmark: many hosts on one Postgres primary with a streaming replica (issue: Scale II).

Starts its own cluster (``scripts/cluster.py``: a primary and one hot standby in the
network namespace ``expstore-db``, actor and learner namespaces joined over veth; root
needed) and measures, in one run:

- rows/s stored into the primary by 1, 2 and 4 actor hosts (one process each, batches of
  64 small rows, for ``--seconds``);
- ``sample(256)`` latency (whole rows) on a learner host from the replica and from the
  primary, while 4 actor hosts write;
- replica lag under that load, from ``pg_stat_replication`` every 100 ms (bytes between
  the WAL sent and replayed; ``replay_lag``);
- the cost of read-your-writes: ``store(1 row)`` then ``len(buffer)`` on the replica,
  with and without ``read_your_writes=True``.

Usage::

    sudo python benchmarks/bench_cluster.py [--seconds 8]

Everything it starts it stops (``cluster.down()``), also on failure.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BATCH = 64


def _cluster_module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "expstore_cluster", ROOT / "scripts" / "cluster.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["expstore_cluster"] = module
    spec.loader.exec_module(module)
    return module


def _rows(actor: str, start: int) -> list[Any]:
    from expstore import DataRow, Experience, ExpMeta

    return [
        DataRow(
            exp_meta=ExpMeta(
                task_id=f"{actor}-{(start + i) // 8}", agent_id=actor, step=(start + i) % 8
            ),
            exp_data=Experience(state={"obs": [0.1] * 8, "i": start + i}, reward_t=1.0),
        )
        for i in range(BATCH)
    ]


def child_actor(url: str, name: str, actor: str, seconds: float) -> dict[str, Any]:
    from expstore import ReplayBuffer

    stored = 0
    with ReplayBuffer(url, name=name) as buffer:
        end = time.monotonic() + seconds
        started = time.monotonic()
        while time.monotonic() < end:
            stored += buffer.store_batch(_rows(actor, stored))
        elapsed = time.monotonic() - started
    return {"rows": stored, "seconds": elapsed}


def child_learner(url: str, name: str, replica: str, seconds: float) -> dict[str, Any]:
    from expstore import ReplayBuffer
    from expstore.samplers import UniformSampler

    read = {} if replica == "-" else {"read_urls": [replica]}
    times = []
    with ReplayBuffer(url, name=name, **read) as buffer:
        sampler = UniformSampler(seed=0)
        buffer.sample(sampler, batch_size=256)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            buffer.sample(sampler, batch_size=256)
            times.append(time.perf_counter() - t0)
    return {
        "median_ms": statistics.median(times) * 1e3,
        "p95_ms": sorted(times)[int(len(times) * 0.95)] * 1e3,
        "n": len(times),
    }


def child_ryw(url: str, name: str, replica: str, ryw: str) -> dict[str, Any]:
    from expstore import ReplayBuffer

    times = []
    with ReplayBuffer(url, name=name, read_urls=[replica], read_your_writes=ryw == "1") as buffer:
        before = len(buffer)
        for i in range(200):
            t0 = time.perf_counter()
            buffer.store_batch(_rows("ryw", i)[:1])
            seen = len(buffer)
            times.append(time.perf_counter() - t0)
        behind = before + 200 - seen
    return {"median_ms": statistics.median(times) * 1e3, "last_read_behind": behind}


def _on(ns: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, __file__, "--child", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=600)
    if proc.returncode:
        raise SystemExit(f"a benchmark process failed:\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _watch_lag(url: str, stop: threading.Event, out: list[tuple[float, float]]) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        while not stop.is_set():
            row = conn.execute(
                text(
                    "SELECT pg_wal_lsn_diff(sent_lsn, replay_lsn), "
                    "COALESCE(EXTRACT(epoch FROM replay_lag), 0) FROM pg_stat_replication"
                )
            ).first()
            if row is not None:
                out.append((float(row[0] or 0), float(row[1]) * 1000))
            time.sleep(0.1)
    engine.dispose()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        role, *args = sys.argv[2:]
        if role == "actor":
            out = child_actor(args[0], args[1], args[2], float(args[3]))
        elif role == "learner":
            out = child_learner(args[0], args[1], args[2], float(args[3]))
        else:
            out = child_ryw(*args)
        print(json.dumps(out))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    clusters = _cluster_module()
    why = clusters.missing()
    if why:
        raise SystemExit(f"bench_cluster: cannot start a cluster here: {why}")
    cluster = clusters.Cluster(
        Path(tempfile.mkdtemp(prefix="expstore-bench-cluster-")), replicas=1, base_port=57432
    )
    try:
        cluster.up()
        primary, replica = cluster.url(0), cluster.url(1)
        actors = [f"expstore-actor{i}" for i in range(1, 5)]
        from expstore import ReplayBuffer

        with ReplayBuffer(primary, name="bench"):
            pass
        print(f"cluster up: primary {primary}, replica {replica}\n")
        print("rows/s into the primary (batches of 64 small rows, one process per actor host)")
        for hosts in (1, 2, 4):
            procs = [
                _on(ns, "actor", primary, "bench", ns, str(args.seconds)) for ns in actors[:hosts]
            ]
            results = [_result(p) for p in procs]
            rate = sum(r["rows"] for r in results) / max(r["seconds"] for r in results)
            print(f"  {hosts} actor host(s): {rate:,.0f} rows/s")
        print("\nsample(256) on a learner host while 4 actor hosts write")
        stop, lags = threading.Event(), []
        watcher = threading.Thread(target=_watch_lag, args=(primary, stop, lags))
        watcher.start()
        writers = [
            _on(ns, "actor", primary, "bench", ns, str(args.seconds * 2 + 4)) for ns in actors
        ]
        time.sleep(1)
        from_replica = _result(
            _on("expstore-learner1", "learner", primary, "bench", replica, str(args.seconds))
        )
        from_primary = _result(
            _on("expstore-learner1", "learner", primary, "bench", "-", str(args.seconds))
        )
        written = [_result(p) for p in writers]
        stop.set()
        watcher.join()
        for label, got in (("replica", from_replica), ("primary", from_primary)):
            median, p95, n = got["median_ms"], got["p95_ms"], got["n"]
            print(f"  from the {label}: median {median:.2f} ms, p95 {p95:.2f} ms ({n} samples)")
        rows_s = sum(r["rows"] for r in written) / max(r["seconds"] for r in written)
        print(f"  writers meanwhile: {rows_s:,.0f} rows/s")
        if lags:
            lag_bytes = [b for b, _ in lags]
            lag_ms = [m for _, m in lags]
            print(
                f"  replica lag: bytes median {statistics.median(lag_bytes):,.0f}, "
                f"max {max(lag_bytes):,.0f}; replay_lag median {statistics.median(lag_ms):.1f} "
                f"ms, max {max(lag_ms):.1f} ms ({len(lags)} readings)"
            )
        print("\nread-your-writes: store 1 row, then len() on the replica (200 times)")
        without = _result(_on("expstore-learner2", "ryw", primary, "bench", replica, "0"))
        with_ = _result(_on("expstore-learner2", "ryw", primary, "bench", replica, "1"))
        for label, got in (("without", without), ("with", with_)):
            print(
                f"  {label:<8} {got['median_ms']:.2f} ms per write+read, "
                f"last read {got['last_read_behind']} rows behind"
            )
        extra = with_["median_ms"] - without["median_ms"]
        print(f"  cost: {extra:+.2f} ms ({with_['median_ms'] / without['median_ms']:.2f}x)")
    finally:
        cluster.down()


if __name__ == "__main__":
    main()
