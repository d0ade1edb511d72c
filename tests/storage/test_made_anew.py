"""A database made anew under a live handle (dropped and created again, restored from a
backup), where keys and counters start over, and one sampler used with two buffers:
nothing a handle or a sampler found before may shape a draw after.

On SQLite the database is made anew by SQLite's backup API writing a freshly built file
into the handle's (a restore); on Postgres by dropping and creating the database again.
"""

from __future__ import annotations

import itertools
import signal
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer
from expstore.db.schema import priorities
from expstore.errors import EmptyBufferError, StorageError
from expstore.query import QueryBuilder
from expstore.samplers import (
    GroupSampler,
    PrioritizedSampler,
    RecencySampler,
    SliceSampler,
    UniformSampler,
)
from tests.helpers import drop_pg_database

Fill = Callable[[str], None]


def _rows(agent: str, count: int, version: int, start: int = 0) -> list[DataRow]:
    return [
        DataRow(
            exp_meta=ExpMeta(
                task_id=f"t{start + i}", agent_id=agent, step=i % 4, policy_version=version
            ),
            exp_data=Experience(state={"i": start + i}),
        )
        for i in range(count)
    ]


def _pairs(prefix: str) -> list[DataRow]:
    """20 rows of 10 tasks, two rows each (whole groups of two)."""
    return [
        DataRow(
            exp_meta=ExpMeta(
                task_id=f"{prefix}{i // 2}", agent_id="a0", step=i % 2, policy_version=20
            ),
            exp_data=Experience(reward_t=float(i)),
        )
        for i in range(20)
    ]


@pytest.fixture(params=["sqlite", "postgres"])
def anew(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Callable[[Fill], None]]:
    """A database URL, and a function that makes that database anew and fills it (given a
    function that fills a database at a URL), under whatever handles are open on it."""
    if request.param == "sqlite":
        target = tmp_path / "buffer.db"

        def restore(fill: Fill) -> None:
            built = tmp_path / f"anew_{len(list(tmp_path.glob('anew_*.db')))}.db"
            fill(f"sqlite:///{built}")
            source, into = sqlite3.connect(built), sqlite3.connect(target)
            try:
                source.backup(into)
            finally:
                source.close()
                into.close()

        return f"sqlite:///{target}", restore
    url: str = request.getfixturevalue("own_pg_database")
    name = make_url(url).database

    def recreate(fill: Fill) -> None:
        admin = create_engine(make_url(url).set(database="postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            drop_pg_database(conn, name)
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
        fill(url)

    return url, recreate


@pytest.fixture
def reader(anew: tuple[str, Callable[[Fill], None]]) -> Iterator[ReplayBuffer]:
    url, _ = anew
    with ReplayBuffer(url, name="b") as writer:
        writer.set_policy_version(20)
        writer.store_batch(_rows("a0", 50, 20) + _rows("a1", 50, 20, start=50))
        writer.store_batch(_pairs("old"))
        ids = [row.id for row in writer.sample(UniformSampler(seed=0), batch_size=100)]
        writer.update_priorities(ids[:1], [0.01])  # the least priority: one row's
    with ReplayBuffer(url, name="b") as buffer:
        yield buffer


def test_draws_after_the_database_was_made_anew_follow_the_new_one(
    anew: tuple[str, Callable[[Fill], None]], reader: ReplayBuffer
) -> None:
    _, make_anew = anew
    fresh = UniformSampler(seed=0, max_staleness=2)
    recency = RecencySampler(seed=0, max_staleness=2)
    prioritized = PrioritizedSampler(alpha=1.0, beta=1.0, eps=0.0, seed=0)
    agent1 = QueryBuilder().eq("exp_meta.agent_id", "a1").build()
    by_index = UniformSampler(seed=0)
    by_index.flat = False
    # What the reader finds and keeps: where fresh rows lie, the least priority, an index.
    for sampler in (fresh, recency, prioritized):
        reader.sample(sampler, batch_size=10)
    reader.sample(by_index, agent1, batch_size=10)

    def fill(url: str) -> None:
        # Keys start over: 1-50 fresh rows of a0, 51-100 stale ones of a2, every priority 1.
        with ReplayBuffer(url, name="b") as writer:
            writer.set_policy_version(20)
            writer.store_batch(_rows("a0", 50, 20) + _rows("a2", 50, 5, start=50))
            writer.store_batch(_pairs("new"))
            everyone = writer.sample(UniformSampler(replacement=False), batch_size=1000)
            ids = [r.id for r in everyone]
            writer.update_priorities(ids, np.ones(len(ids)))

    epochs = UniformSampler(replacement=False, seed=0)
    once = UniformSampler(consume_after=1, seed=0)
    reader.sample(epochs, batch_size=75)  # 75 of the 120 old rows
    with pytest.raises(EmptyBufferError):  # every old row spent, and known so
        for _ in range(100):
            reader.sample(once, batch_size=50)
    make_anew(fill)
    # The first draw after already starts afresh: a new epoch, no old row known spent.
    assert [len(reader.sample(epochs, batch_size=50)) for _ in range(3)] == [50, 50, 20]
    assert len(reader.sample(once, batch_size=10)) > 0
    for sampler in (fresh, recency):
        for _ in range(10):
            drawn = reader.sample(sampler, batch_size=10)
            assert drawn and all(r.exp_meta.policy_version == 20 for r in drawn)
    for _ in range(5):
        _, info = prioritized.sample_with_info(reader.storage, 10)
        np.testing.assert_allclose(info["weights"], 1.0)  # every priority the same
    with pytest.raises(EmptyBufferError):
        reader.sample(by_index, agent1, batch_size=10)  # no a1 row any more
    assert {r.exp_meta.agent_id for r in reader.sample(by_index, batch_size=50)} <= {"a0", "a2"}


def test_a_priority_update_by_an_id_read_before_the_database_was_made_anew_sets_nothing(
    anew: tuple[str, Callable[[Fill], None]], reader: ReplayBuffer
) -> None:
    url, make_anew = anew
    old_ids = [r.id for r in reader.sample(UniformSampler(seed=0), batch_size=20)]

    def fill(url: str) -> None:  # other rows under the keys the reader remembers
        with ReplayBuffer(url, name="b") as writer:
            writer.store_batch(_rows("a3", 100, 1))

    make_anew(fill)
    reader.update_priorities(old_ids, np.full(len(old_ids), 9.0))
    engine = create_engine(url)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(priorities)).scalar() == 0
    engine.dispose()


def test_a_handle_whose_buffer_row_holds_another_buffer_now_says_so(
    anew: tuple[str, Callable[[Fill], None]], reader: ReplayBuffer
) -> None:
    url, make_anew = anew
    reader.sample(UniformSampler(seed=0), batch_size=10)

    def fill(url: str) -> None:  # another buffer created first takes the reader's buffer id
        with ReplayBuffer(url, name="other") as other:
            other.store_batch(_rows("a0", 10, 1))
        with ReplayBuffer(url, name="b") as writer:
            writer.store_batch(_rows("a0", 10, 1))

    make_anew(fill)
    for use in (
        lambda: reader.sample(UniformSampler(seed=0), batch_size=10),
        lambda: reader.store_batch(_rows("a9", 5, 1)),
        lambda: len(reader),
        lambda: list(reader.query()),
        lambda: reader.claim(3, consumer="learner"),
    ):
        with pytest.raises(StorageError, match="open the buffer again"):
            use()
    with ReplayBuffer(url, name="other") as other:
        assert len(other) == 10  # nothing written into the buffer that took the row
    with ReplayBuffer(url, name="b") as again:
        assert len(again) == 10
        assert len(again.sample(UniformSampler(seed=0), batch_size=10)) == 10


def test_one_sampler_used_with_two_buffers_starts_afresh_on_each(
    db_url: str, buffer_name: str
) -> None:
    with (
        ReplayBuffer(db_url, name=buffer_name + "_a") as first,
        ReplayBuffer(db_url, name=buffer_name + "_b") as second,
    ):
        for i in range(10):  # keys of the two buffers interleaved
            first.store_batch(_rows("a0", 10, 1, start=20 * i))
            second.store_batch(_rows("a0", 10, 1, start=20 * i + 10))
        epochs = UniformSampler(replacement=False, seed=0)
        for _ in range(3):
            first.sample(epochs, batch_size=10)
        seen = [r.id for _ in range(10) for r in second.sample(epochs, batch_size=10)]
        assert len(set(seen)) == 100  # one whole epoch of the second buffer

        once = UniformSampler(consume_after=1, seed=0)
        with pytest.raises(EmptyBufferError):
            for _ in range(100):
                first.sample(once, batch_size=10)
        drawn: set[str] = set()
        with pytest.raises(EmptyBufferError):
            for _ in range(100):
                drawn.update(r.id for r in second.sample(once, batch_size=10))
        assert len(drawn) == 100  # every row of the second buffer, once

    with (
        ReplayBuffer(db_url, name=buffer_name + "_c") as third,
        ReplayBuffer(db_url, name=buffer_name + "_d") as fourth,
    ):
        third.store_batch(_pairs("c"))
        fourth.store_batch(_pairs("d"))
        windows = SliceSampler(2, seed=0)
        for buffer, prefix in ((third, "c"), (fourth, "d"), (third, "c")):
            tasks = {r.exp_meta.task_id[0] for r in buffer.sample(windows, batch_size=4)}
            assert tasks == {prefix}


def test_an_epoch_goes_on_over_two_handles_of_one_file_however_spelt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with (
        ReplayBuffer("sqlite:///one.db", name="b") as relative,
        ReplayBuffer(f"sqlite:///{tmp_path / 'one.db'}", name="b") as absolute,
    ):
        relative.store_batch(_rows("a0", 40, 1))
        epochs = UniformSampler(replacement=False, seed=0)
        seen = [r.id for b in (relative, absolute) * 2 for r in b.sample(epochs, batch_size=10)]
        assert len(set(seen)) == 40


def test_group_summaries_and_claim_floors_after_the_database_was_made_anew(
    anew: tuple[str, Callable[[Fill], None]],
) -> None:
    url, make_anew = anew

    def groups_of_four(prefix: str, shift: int) -> list[DataRow]:
        return [
            DataRow(
                exp_meta=ExpMeta(task_id=f"{prefix}{(i + shift) // 4}", agent_id="a0", step=i),
                exp_data=Experience(state={"i": i}),
            )
            for i in range(40)
        ]

    with ReplayBuffer(url, name="b") as writer:
        writer.store_batch(groups_of_four("old", 0))
    with ReplayBuffer(url, name="b") as reader:
        grouped = GroupSampler("task_id", 4, seed=0)
        reader.sample(grouped, batch_size=8)
        reader.claim(40, consumer="learner").ack()  # the FIFO floor: past every key

        def fill(url: str) -> None:  # the same keys, the groups two keys further on
            with ReplayBuffer(url, name="b") as writer:
                writer.store_batch(groups_of_four("new", 2))

        make_anew(fill)
        assert len(reader.claim(5, consumer="learner").ids) == 5  # before any draw
        for _ in range(3):
            tasks = [r.exp_meta.task_id for r in reader.sample(grouped, batch_size=8)]
            assert len(set(tasks[:4])) == 1 and len(set(tasks[4:])) == 1
            assert all(t.startswith("new") for t in tasks)


def test_a_draw_whose_buffer_seems_made_anew_at_every_read_still_ends(
    db_url: str, buffer_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Servers taking turns between an old and a new database (a pooler in front of a
    # primary made anew and a lagging replica): the draw chooses again a few times only.
    from expstore.storage.sql import SqlStorage

    turns = itertools.count()
    monkeypatch.setattr(SqlStorage, "identity", property(lambda self: ("x", "b", next(turns))))
    signal.signal(signal.SIGALRM, signal.default_int_handler)
    signal.alarm(60)  # a loop that never ends fails the test rather than hang the run
    try:
        with ReplayBuffer(db_url, name=buffer_name) as buffer:
            buffer.store_batch(_rows("a0", 20, 1))
            assert len(buffer.sample(UniformSampler(seed=0), batch_size=4)) == 4
            assert len(buffer.sample(UniformSampler(consume_after=1), batch_size=4)) > 0
    finally:
        signal.alarm(0)
