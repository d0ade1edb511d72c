"""Dedup: rows whose content the buffer already holds are skipped or refused, in the
write's own transaction, across handles and processes."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from expstore import DuplicateContentError, ReplayBuffer
from expstore.errors import InvalidArgumentError
from tests.helpers import make_row


def rollout(i: int, **extra):
    """The same rollout each time it is built (a retry gets a new id and time)."""
    return make_row(f"p{i}", "a", i, reward=1.0, state={"i": i, "obs": np.arange(3.0)}, **extra)


def test_skip_leaves_out_rows_already_stored_and_reports_it(buf: ReplayBuffer) -> None:
    assert buf.store_batch([rollout(i) for i in range(4)]) == 4
    again = [rollout(i) for i in range(2, 6)]  # 2 and 3 are retries
    assert buf.store_batch(again, dedup="skip") == 2
    assert len(buf) == 6
    assert buf.store(rollout(5), dedup="skip") == 0
    assert buf.store(rollout(6), dedup="skip") == 1


def test_skip_also_drops_repeats_within_a_batch(buf: ReplayBuffer) -> None:
    assert buf.store_batch([rollout(1), rollout(1), rollout(2)], dedup="skip") == 2
    assert len(buf) == 2


def test_error_stores_nothing_and_names_the_rows(buf: ReplayBuffer) -> None:
    buf.store(rollout(1))
    batch = [rollout(0), rollout(1)]
    with pytest.raises(DuplicateContentError, match=rf"1 of 2 rows \('{batch[1].id}'\)"):
        buf.store_batch(batch, dedup="error")
    assert len(buf) == 1
    assert buf.store_batch([rollout(0)], dedup="error") == 1


def test_without_dedup_duplicates_are_stored(buf: ReplayBuffer) -> None:
    assert buf.store_batch([rollout(1), rollout(1)]) == 2
    assert len(buf) == 2


def test_content_means_every_field_but_id_and_time(buf: ReplayBuffer) -> None:
    buf.store(rollout(1))
    different = [
        rollout(1, version=3),  # another policy version
        make_row("p1", "a", 1, reward=0.5, state={"i": 1, "obs": np.arange(3.0)}),
        make_row("p1", "a", 1, reward=1.0, state={"i": 1, "obs": np.arange(3.0) + 1}),
        make_row("p1", "b", 1, reward=1.0, state={"i": 1, "obs": np.arange(3.0)}),
        make_row("p1", "a", 1, reward=1.0, state={"i": 1, "obs": np.arange(3, dtype=np.int64)}),
    ]
    assert buf.store_batch(different, dedup="error") == 5
    same = make_row(
        "p1", "a", 1, reward=1.0, execute_time=5.0, state={"i": 1, "obs": np.arange(3.0)}
    )
    assert buf.store(same, dedup="skip") == 0


def test_dedup_is_per_buffer(db_url: str, buffer_name: str) -> None:
    with (
        ReplayBuffer(db_url, name=buffer_name) as a,
        ReplayBuffer(db_url, name=buffer_name + "_other") as b,
    ):
        a.store(rollout(1))
        assert b.store(rollout(1), dedup="error") == 1


def test_concurrent_writers_store_a_rollout_once(db_url: str, buffer_name: str) -> None:
    results: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def writer() -> None:
        try:
            with ReplayBuffer(db_url, name=buffer_name) as buffer:
                start.wait()
                results.append(buffer.store_batch([rollout(i) for i in range(20)], dedup="skip"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(results) == [0, 0, 0, 20]
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        assert len(buffer) == 20


@pytest.mark.parametrize("bad", ["yes", True, 1])
def test_bad_dedup_is_refused(buf: ReplayBuffer, bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match='dedup must be None, "skip"'):
        buf.store(rollout(1), dedup=bad)  # type: ignore[arg-type]
    assert len(buf) == 0
