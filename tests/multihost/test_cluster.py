"""Many "machines" on one Postgres primary with a streaming replica (scripts/cluster.py):
read routing, read-your-writes, lag, a replica and connections lost, actors killed.

These tests start a real cluster (root, ``ip netns``, Debian's Postgres 15 binaries). Where
that is not possible they skip and say why; with ``EXPSTORE_REQUIRE_CLUSTER=1`` (CI on
this kind of machine) they fail instead.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from expstore import InvalidArgumentError, ReplayBuffer, ReplicaError, ReplicaWarning
from expstore.samplers import UniformSampler
from tests.helpers import make_rows

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("expstore_cluster", ROOT / "scripts" / "cluster.py")
assert _spec is not None and _spec.loader is not None
_cluster = importlib.util.module_from_spec(_spec)
sys.modules["expstore_cluster"] = _cluster
_spec.loader.exec_module(_cluster)
HOSTS, Cluster, missing = _cluster.HOSTS, _cluster.Cluster, _cluster.missing

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    why = missing()
    if why:
        if os.environ.get("EXPSTORE_REQUIRE_CLUSTER"):
            pytest.fail(f"EXPSTORE_REQUIRE_CLUSTER is set but the cluster {why}")
        pytest.skip(f"cluster tests skipped: scripts/cluster.py {why}")
    made = Cluster(Path(tempfile.mkdtemp(prefix="expstore-cluster-")), replicas=1, base_port=56432)
    try:
        made.up()
        yield made
    finally:
        made.down()


@pytest.fixture
def name(buffer_name: str) -> str:
    return buffer_name


def _port(buffer: ReplayBuffer, *, write: bool = False) -> int:
    handle = buffer.storage.index.handle
    with handle.write() if write else handle.read() as conn:
        return int(conn.execute(select(func.inet_server_port())).scalar_one())


def _router(buffer: ReplayBuffer):  # noqa: ANN202
    router = buffer.storage.index.handle.connections.router
    assert router is not None
    return router


def _replica_sql(cluster: Cluster, sql: str) -> None:
    from sqlalchemy import create_engine

    engine = create_engine(cluster.url(1), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(sql))
    engine.dispose()


def test_reads_go_to_the_replica_and_writes_to_the_primary(cluster: Cluster, name: str) -> None:
    with ReplayBuffer(cluster.url(0), name=name, read_urls=[cluster.url(1)]) as buffer:
        assert _port(buffer) == cluster.port(1)
        assert _port(buffer, write=True) == cluster.port(0)
        buffer.store_batch(make_rows(30))
        for _ in range(200):  # without read_your_writes the replica shows rows when replayed
            if len(buffer) == 30:
                break
            time.sleep(0.01)
        assert len(buffer) == 30
        assert len(buffer.sample(UniformSampler(), batch_size=8)) == 8


def test_a_replica_is_read_only_once_it_has_replayed_the_buffers_creation(
    cluster: Cluster, name: str
) -> None:
    _replica_sql(cluster, "SELECT pg_wal_replay_pause()")
    try:  # the buffer is made on the primary while the replica replays nothing
        with ReplayBuffer(cluster.url(0), name=name, read_urls=[cluster.url(1)]) as buffer:
            buffer.store_batch(make_rows(3))
            with pytest.warns(ReplicaWarning, match="had not replayed"):
                assert len(buffer) == 3  # from the primary, not an error from the replica
    finally:
        _replica_sql(cluster, "SELECT pg_wal_replay_resume()")


def test_read_your_writes_sees_every_write_at_once(cluster: Cluster, name: str) -> None:
    with ReplayBuffer(
        cluster.url(0), name=name, read_urls=[cluster.url(1)], read_your_writes=True
    ) as buffer:
        sampler = UniformSampler(seed=0)
        for n in range(1, 41):
            buffer.store_batch(make_rows(1))
            assert len(buffer) == n  # read on the replica, after it replayed the write
            assert len(buffer.sample(sampler, batch_size=4)) == 4
        assert _port(buffer) == cluster.port(1)


def test_a_replica_beyond_max_lag_is_left_for_the_primary(cluster: Cluster, name: str) -> None:
    with ReplayBuffer(
        cluster.url(0), name=name, read_urls=[cluster.url(1)], max_lag_s=0.2
    ) as buffer:
        buffer.store_batch(make_rows(5))
        _replica_sql(cluster, "SELECT pg_wal_replay_pause()")
        try:
            buffer.store_batch(make_rows(5))
            time.sleep(1.3)
            with pytest.warns(ReplicaWarning, match="max_lag_s"):
                assert _port(buffer) == cluster.port(0)
            assert len(buffer) == 10  # from the primary
        finally:
            _replica_sql(cluster, "SELECT pg_wal_replay_resume()")
        deadline = time.monotonic() + 10
        while _port(buffer) != cluster.port(1):
            assert time.monotonic() < deadline, "reads never came back to the replica"
            time.sleep(0.2)


def test_a_killed_replica_sends_reads_to_the_primary_and_they_come_back(
    cluster: Cluster, name: str
) -> None:
    with ReplayBuffer(cluster.url(0), name=name, read_urls=[cluster.url(1)]) as buffer:
        buffer.store_batch(make_rows(50))
        time.sleep(0.5)
        _router(buffer).retry_s = 0.5
        sampler = UniformSampler(seed=1)
        assert len(buffer.sample(sampler, batch_size=16)) == 16
        cluster.kill(1)
        try:
            with pytest.warns(ReplicaWarning, match="replica"):
                for _ in range(5):  # no error reaches the loop
                    assert len(buffer.sample(sampler, batch_size=16)) == 16
            assert _port(buffer) == cluster.port(0)
        finally:
            cluster.start(1)
        deadline = time.monotonic() + 15
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ReplicaWarning)
            while _port(buffer) != cluster.port(1):
                assert time.monotonic() < deadline, "reads never came back to the replica"
                time.sleep(0.2)
        assert len(buffer.sample(sampler, batch_size=16)) == 16


def test_read_urls_that_are_not_replicas_of_the_primary_are_refused(
    cluster: Cluster, name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    primary = cluster.url(0)
    with pytest.raises(ReplicaError, match="is a primary, not a replica"):
        ReplayBuffer(primary, name=name, read_urls=[primary])
    from expstore.db import replicas

    ids = iter([1, 2])  # the primary's system identifier, then the replica's
    monkeypatch.setattr(replicas, "_system_id", lambda conn: next(ids))
    with pytest.raises(ReplicaError, match="replica of another cluster"):
        ReplayBuffer(primary, name=name, read_urls=[cluster.url(1)])
    monkeypatch.undo()
    unreachable = cluster.url(1).replace(str(cluster.port(1)), "1")
    with pytest.warns(ReplicaWarning, match="cannot be reached"):
        buffer = ReplayBuffer(primary, name=name, read_urls=[unreachable])
    with buffer:
        buffer.store_batch(make_rows(3))
        assert len(buffer) == 3  # from the primary
    with pytest.raises(InvalidArgumentError, match="list of replica URLs"):
        ReplayBuffer(primary, name=name, read_urls=cluster.url(1))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="max_lag_s"):
        ReplayBuffer(primary, name=name, read_urls=[cluster.url(1)], max_lag_s=-1)
    with pytest.raises(InvalidArgumentError, match="Postgres primary"):
        ReplayBuffer(f"sqlite:///{tmp_path / 'x.db'}", read_urls=[cluster.url(1)])


def _on(ns: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-m", "tests.multihost.node", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_actors_and_learners_on_their_own_hosts_survive_kills(
    cluster: Cluster, name: str, tmp_path: Path
) -> None:
    """4 actor hosts write, 2 learner hosts sample from the replica; meanwhile the replica
    is killed and restarted, the primary's connections are terminated, and an actor host's
    process is SIGKILLed and restarted. Afterwards no row is lost or stored twice, the
    capacity is exact, and every row a learner got was committed."""
    from tests.multihost.node import ROWS

    batches, capacity = 40, 2000
    url = cluster.url(0)
    with ReplayBuffer(url, name=name, capacity=capacity):
        pass
    actors = [f"expstore-actor{i}" for i in range(1, 5)]
    learners = [f"expstore-learner{i}" for i in range(1, 3)]
    outs = [tmp_path / f"learner{i}.ids" for i in range(2)]
    notes = {ns: str(tmp_path / f"{ns}.progress") for ns in actors}
    stop = tmp_path / "stop"
    running = {ns: _on(ns, "actor", url, name, ns, str(batches), notes[ns]) for ns in actors}
    sampling = [
        _on(ns, "learner", url, name, cluster.url(1), str(stop), str(out))
        for ns, out in zip(learners, outs, strict=True)
    ]
    first = actors[0]
    _until(lambda: _progress(notes[first]) >= 5, running)
    Path(notes[first] + ".hold").touch()  # it stops before its next batch...
    _until(lambda: Path(notes[first] + ".holding").exists(), running)
    running[first].kill()  # ...and is SIGKILLed there, mid-run
    running[first].wait()
    seen = _lines(outs)
    cluster.kill(1)  # the replica dies under the learners
    _until(lambda: _lines(outs) >= seen + 20, sampling)  # they go on (from the primary)
    cluster.start(1)
    from sqlalchemy import create_engine

    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:  # every other connection to the primary is cut
        conn.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND backend_type = 'client backend'"
            )
        )
    Path(notes[first] + ".hold").unlink()
    running[first] = _on(first, "actor", url, name, first, str(batches), notes[first])
    for ns, proc in running.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{ns}: {err[-2000:]}"
        assert out.startswith("done"), (ns, out)
    stop.touch()
    for ns, proc in zip(learners, sampling, strict=True):
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, f"{ns}: {err[-2000:]}"
        assert out.startswith("done"), (ns, out)
    admin.dispose()
    with ReplayBuffer(url, name=name) as buffer:
        state = buffer.storage.index.state_now()
        inserted = _inserted(buffer)
        expected = {f"{ns}-{b}-{i}" for ns in actors for b in range(batches) for i in range(ROWS)}
        assert inserted == len(expected)  # every row stored exactly once (none lost, none twice)
        assert state[2] == len(buffer) == capacity  # the capacity is exact
        kept = {r.id for r in buffer.query()}
        assert len(kept) == capacity and kept <= expected
    got = [line.strip() for out in outs for line in out.read_text().splitlines()]
    assert got, "the learners sampled nothing"
    assert set(got) <= expected  # only committed rows reached a learner


def _progress(path: str) -> int:
    try:
        return int(Path(path).read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def _lines(paths: list[Path]) -> int:
    return sum(len(p.read_text().splitlines()) for p in paths if p.exists())


def _until(done, processes, timeout: float = 120.0) -> None:  # noqa: ANN001
    """Wait for ``done()``; fail at once if one of ``processes`` died meanwhile."""
    deadline = time.monotonic() + timeout
    while not done():
        procs = processes.values() if isinstance(processes, dict) else processes
        for proc in procs:
            if proc.poll() is not None:
                out, err = proc.communicate()
                pytest.fail(f"a process ended early ({proc.returncode}): {out} {err[-2000:]}")
        assert time.monotonic() < deadline, "timed out waiting on the cluster run"
        time.sleep(0.02)


def _inserted(buffer: ReplayBuffer) -> int:
    from expstore.db.schema import buffers

    handle = buffer.storage.index.handle
    with handle.write() as conn:
        return int(
            conn.execute(
                select(buffers.c.inserted).where(buffers.c.id == handle.buffer_id)
            ).scalar_one()
        )


def test_the_cluster_hosts_are_separate_network_stacks(cluster: Cluster) -> None:
    for ns, address in HOSTS.items():
        shown = subprocess.run(
            ["ip", "netns", "exec", ns, "ip", "-4", "addr"], capture_output=True, text=True
        ).stdout
        assert address in shown


def test_max_staleness_draws_on_a_replica_return_only_fresh_rows(
    cluster: Cluster, name: str
) -> None:
    """A draw with max_staleness read on the replica finds where the fresh rows lie there
    (kept per server: a replica behind the primary may hold stale rows it has deleted)."""
    with ReplayBuffer(cluster.url(0), name=name, read_urls=[cluster.url(1)]) as buffer:
        for version in range(6):
            rows = make_rows(10)
            for row in rows:
                row.exp_meta.policy_version = version
            buffer.store_batch(rows)
        buffer.set_policy_version(5)
        deadline = time.monotonic() + 10
        while len(buffer) != 60 or buffer.policy_version() != 5:  # the replica replays
            assert time.monotonic() < deadline, "the replica never caught up"
            time.sleep(0.05)
        assert _port(buffer) == cluster.port(1)
        sampler = UniformSampler(seed=0, max_staleness=1)
        index = buffer.storage.spaces
        probed = index.keys_probed
        drawn = {
            row.exp_meta.policy_version
            for _ in range(20)
            for row in buffer.sample(sampler, batch_size=8)
        }
        assert drawn == {4, 5}
        assert index.keys_probed == probed  # the fresh rows are the newest: no probe
        servers = {server for server, _ in index.fresh_bounds._stale}
        assert servers == {str(_router(buffer).replicas[0].engine.url)}


@pytest.mark.slow
def test_prompt_actors_store_each_completion_once_when_the_primary_is_killed(
    cluster: Cluster, name: str, tmp_path: Path
) -> None:
    """3 actor hosts take prompts and store their completions with each prompt's ack while
    the primary is SIGKILLed (mid-commit, for some) and restarted, twice. Afterwards every
    prompt has exactly its 4 completions, each stored once, each counted once towards its
    target, and every prompt is done."""
    from expstore import DataRow, Experience, ExpMeta

    prompts_n = 60
    url = cluster.url(0)
    with ReplayBuffer(url, name=name) as prompts:
        rows = [
            DataRow(
                id=f"q{i}",
                exp_meta=ExpMeta(task_id=f"q{i}", agent_id="d", step=0),
                exp_data=Experience(),
            )
            for i in range(prompts_n)
        ]
        prompts.store_prompts(rows, group_size=4)
    stop = tmp_path / "stop"
    actors = {
        ns: _on(ns, "prompts", url, name, ns, str(stop))
        for ns in [f"expstore-actor{i}" for i in range(1, 4)]
    }

    def done() -> int:
        with ReplayBuffer(url, name=name + "_out") as out:
            return len(out)

    for at in (prompts_n, 2 * prompts_n):  # completions stored before each kill
        _until(lambda at=at: done() >= at, actors)
        cluster.kill(0)  # the primary dies under the actors' commits
        time.sleep(0.5)
        cluster.start(0)

    def finished() -> bool:
        try:
            with ReplayBuffer(url, name=name) as prompts:
                made = prompts.queue_stats().completions
                return made is not None and made.done == prompts_n
        except Exception:  # noqa: BLE001 - the primary may still be starting
            return False

    _until(finished, actors, timeout=240)
    stop.touch()
    for ns, proc in actors.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"{ns}: {err[-2000:]}"
        assert out.startswith("done"), (ns, out)
    with ReplayBuffer(url, name=name) as prompts, ReplayBuffer(url, name=name + "_out") as out:
        stored = [r.id for r in out.query()]
        want = {f"q{i}/c{j}" for i in range(prompts_n) for j in range(4)}
        assert len(stored) == len(set(stored)) and set(stored) == want
        lineage = prompts.lineage([f"q{i}" for i in range(prompts_n)])
        assert {(v.state, v.target, v.done) for v in lineage.values()} == {("consumed", 4, 4)}
        made = out.lineage(stored)
        assert all(v.produced_by is not None for v in made.values())
