"""A Postgres primary with streaming replicas, and network namespaces standing for hosts.

    python scripts/cluster.py up [--replicas 2] [--dir /tmp/expstore-cluster]
    python scripts/cluster.py status
    python scripts/cluster.py down

``up`` makes, on this machine:

- network namespaces ``expstore-db`` (the database host, 10.88.0.2; the primary and the
  replicas listen there), ``expstore-actor1`` .. ``expstore-actor4`` (10.88.0.11-14) and
  ``expstore-learner1`` .. ``expstore-learner2`` (10.88.0.21-22), each joined by a veth
  pair to the bridge ``expbr0`` (10.88.0.1) in the root namespace, so traffic between them
  crosses a network stack as between machines;
- a Postgres 15 primary (``initdb``, port 55432) and ``--replicas`` hot standbys made by
  ``pg_basebackup -R`` streaming from it (ports 55433, 55434, ...), each with its own data
  directory under ``--dir``, run as the ``postgres`` user inside ``expstore-db``.

Run a command on a "host" with ``ip netns exec expstore-actor1 <command>``; the URLs are
printed by ``status`` (and :func:`urls`). ``down`` stops every server and removes every
namespace, link and directory ``up`` made. It needs root, ``ip`` and Debian's Postgres 15
binaries; :func:`missing` says what is missing elsewhere.

Tests and ``benchmarks/bench_cluster.py`` import this module (:class:`Cluster`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

BIN = Path("/usr/lib/postgresql/15/bin")
BRIDGE = "expbr0"
SUBNET = "10.88.0"
DB_NS = "expstore-db"
DB_ADDRESS = f"{SUBNET}.2"
HOSTS = {
    DB_NS: DB_ADDRESS,
    **{f"expstore-actor{i}": f"{SUBNET}.{10 + i}" for i in range(1, 5)},
    **{f"expstore-learner{i}": f"{SUBNET}.{20 + i}" for i in range(1, 3)},
}
PRIMARY_PORT = 55432
DEFAULT_DIR = Path("/tmp/expstore-cluster")
DATABASE = "expstore"


def missing() -> str | None:
    """Why a cluster cannot be made here (None: it can)."""
    if sys.platform != "linux":
        return "needs Linux (network namespaces)"
    if os.geteuid() != 0:
        return "needs root (ip netns, running Postgres as the postgres user)"
    if shutil.which("ip") is None:
        return "needs the ip command (iproute2)"
    if not (BIN / "initdb").exists() or not (BIN / "pg_basebackup").exists():
        return f"needs Postgres 15 server binaries in {BIN} (Debian: postgresql-15)"
    if subprocess.run(["id", "postgres"], capture_output=True).returncode:
        return "needs a postgres system user to run the servers as"
    return None


def _run(*args: str, check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(args), capture_output=True, text=True, check=False)
    if check and done.returncode:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    if not quiet and done.stdout.strip() and os.environ.get("EXPSTORE_CLUSTER_VERBOSE"):
        print(done.stdout.strip())
    return done


def _as_postgres(
    *args: str, ns: str | None = DB_NS, check: bool = True
) -> subprocess.CompletedProcess[str]:
    prefix = ["ip", "netns", "exec", ns] if ns else []
    return _run(*prefix, "runuser", "-u", "postgres", "--", *args, check=check)


class Cluster:
    """The servers and namespaces of one cluster directory."""

    def __init__(
        self, directory: Path = DEFAULT_DIR, replicas: int = 2, base_port: int = PRIMARY_PORT
    ) -> None:
        self.dir = Path(directory)
        self.replicas = replicas
        self.base_port = base_port

    # -- where things are ------------------------------------------------------------------
    def data(self, node: int) -> Path:
        """Node 0 is the primary, 1.. the replicas."""
        return self.dir / ("primary" if node == 0 else f"replica{node}")

    def port(self, node: int) -> int:
        return self.base_port + node

    def url(self, node: int = 0, database: str = DATABASE) -> str:
        return f"postgresql+psycopg://postgres@{DB_ADDRESS}:{self.port(node)}/{database}"

    def urls(self) -> dict[str, str]:
        out = {"primary": self.url(0)}
        out.update({f"replica{i}": self.url(i) for i in range(1, self.replicas + 1)})
        return out

    # -- network ---------------------------------------------------------------------------
    def network_up(self) -> None:
        if _run("ip", "link", "show", BRIDGE, check=False, quiet=True).returncode:
            _run("ip", "link", "add", BRIDGE, "type", "bridge")
            _run("ip", "addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        existing = _run("ip", "netns", "list", quiet=True).stdout
        for n, (ns, address) in enumerate(HOSTS.items()):
            if ns in existing:
                continue
            outer, inner = f"vexp{n}", f"vexp{n}i"
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            _run("ip", "link", "set", inner, "netns", ns)
            _run("ip", "link", "set", outer, "master", BRIDGE)
            _run("ip", "link", "set", outer, "up")
            _run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{address}/24", "dev", inner)
            _run("ip", "netns", "exec", ns, "ip", "link", "set", inner, "up")
            _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")

    def network_down(self) -> None:
        existing = _run("ip", "netns", "list", quiet=True).stdout
        for n, ns in enumerate(HOSTS):
            _run("ip", "link", "del", f"vexp{n}", check=False, quiet=True)
            if ns in existing:
                _run("ip", "netns", "del", ns, check=False)
        _run("ip", "link", "del", BRIDGE, check=False, quiet=True)

    # -- servers ---------------------------------------------------------------------------
    def _conf(self, node: int) -> None:
        with open(self.data(node) / "postgresql.auto.conf", "a") as conf:
            conf.write(
                f"port = {self.port(node)}\n"
                f"listen_addresses = '{DB_ADDRESS},127.0.0.1'\n"
                f"unix_socket_directories = '{self.dir}'\n"
                "wal_level = replica\nmax_wal_senders = 10\nhot_standby = on\n"
                "hot_standby_feedback = on\nfsync = on\nshared_buffers = 128MB\n"
                "wal_keep_size = 512MB\n"
            )

    def start(self, node: int) -> None:
        log = self.dir / f"node{node}.log"
        _as_postgres(
            str(BIN / "pg_ctl"),
            "-D",
            str(self.data(node)),
            "-l",
            str(log),
            "-w",
            "-t",
            "60",
            "start",
        )

    def stop(self, node: int, mode: str = "fast") -> None:
        _as_postgres(
            str(BIN / "pg_ctl"), "-D", str(self.data(node)), "-m", mode, "-w", "stop", check=False
        )

    def kill(self, node: int) -> None:
        """SIGKILL the node's postmaster (its children exit with it)."""
        pid_file = self.data(node) / "postmaster.pid"
        if pid_file.exists():
            pid = int(pid_file.read_text().split()[0])
            _run("kill", "-9", str(pid), check=False)
            for _ in range(100):
                if _run("kill", "-0", str(pid), check=False, quiet=True).returncode:
                    break
                time.sleep(0.05)

    def _client(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        """A Postgres client program against the primary, over its socket directory."""
        where = ("-h", str(self.dir), "-p", str(self.port(0)), "-U", "postgres")
        return _as_postgres(str(BIN / tool), *where, *args)

    def up(self) -> None:
        why = missing()
        if why:
            raise RuntimeError(f"cannot start a cluster here: {why}")
        self.network_up()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o755)
        shutil.chown(self.dir, "postgres", "postgres")
        if not (self.data(0) / "PG_VERSION").exists():
            _as_postgres(
                str(BIN / "initdb"),
                "-D",
                str(self.data(0)),
                "-A",
                "trust",
                "-U",
                "postgres",
                ns=None,
            )
            with open(self.data(0) / "pg_hba.conf", "a") as hba:
                hba.write(
                    f"host all all {SUBNET}.0/24 trust\nhost replication all {SUBNET}.0/24 trust\n"
                )
            self._conf(0)
        self.start(0)
        query = f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'"
        exists = self._client("psql", "-tAc", query).stdout
        if not exists.strip():
            self._client("createdb", DATABASE)
        for node in range(1, self.replicas + 1):
            if not (self.data(node) / "PG_VERSION").exists():
                _as_postgres(
                    str(BIN / "pg_basebackup"),
                    "-h",
                    DB_ADDRESS,
                    "-p",
                    str(self.port(0)),
                    "-U",
                    "postgres",
                    "-D",
                    str(self.data(node)),
                    "-R",
                    "-X",
                    "stream",
                    "-c",
                    "fast",
                )
                self._conf(node)
            self.start(node)

    def down(self) -> None:
        for node in range(self.replicas, -1, -1):
            if self.data(node).exists():
                self.stop(node, "immediate")
        self.network_down()
        shutil.rmtree(self.dir, ignore_errors=True)

    def status(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for node in range(self.replicas + 1):
            name = "primary" if node == 0 else f"replica{node}"
            running = (
                _as_postgres(
                    str(BIN / "pg_ctl"), "-D", str(self.data(node)), "status", check=False
                ).returncode
                == 0
            )
            out[name] = {"url": self.url(node), "running": running}
        out["namespaces"] = HOSTS
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    args = parser.parse_args()
    why = missing()
    if why:
        raise SystemExit(f"scripts/cluster.py {args.command}: {why}")
    cluster = Cluster(args.dir, args.replicas)
    if args.command == "up":
        cluster.up()
        print(json.dumps(cluster.status(), indent=2))
    elif args.command == "down":
        cluster.down()
        print("cluster stopped; namespaces, links and", args.dir, "removed")
    else:
        print(json.dumps(cluster.status(), indent=2))


if __name__ == "__main__":
    main()
