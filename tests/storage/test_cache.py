"""The decoded-row cache (expstore.storage.cache): rows sampled again are not read again,
and the cache never changes what a sample returns — the same rows and values as without
it, each batch the caller's own, never a row the database would not have chosen."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from expstore import DataRow, ReplayBuffer
from expstore.converters import NumpyConverter
from expstore.errors import ExpstoreError, InvalidArgumentError
from expstore.query import QueryBuilder
from expstore.samplers import PrioritizedSampler, RecencySampler, UniformSampler
from expstore.storage.cache import RowCache
from tests.helpers import make_row, make_rows

FIELDS = NumpyConverter({"obs": "exp_data.state.obs", "i": "exp_data.state.i", "r": "reward_t"})


def _pair(url: str, name: str, **kwargs: Any) -> tuple[ReplayBuffer, ReplayBuffer]:
    """Two handles of one buffer: with the cache, and without."""
    return ReplayBuffer(url, name=name, **kwargs), ReplayBuffer(url, name=name, cache_bytes=0)


def _same_batch(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_a_row_sampled_again_comes_from_the_cache(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(30, tensor=True))
    keys = buffer.storage.key_index()["key"][:10]
    first = buffer.storage.fetch(keys, FIELDS.paths)
    stats = buffer.cache_stats()
    # kept on its first read: the cache has room to spare (see the next test)
    assert (stats.hits, stats.misses, stats.rows) == (0, 10, 10)
    assert 0 < stats.bytes <= stats.budget_bytes
    buffer.storage.fetch(keys[:6], FIELDS.paths)
    stats = buffer.cache_stats()
    assert (stats.hits, stats.misses, stats.rows) == (6, 10, 10)
    again = buffer.storage.fetch(keys[::-1], FIELDS.paths)
    assert again.ids == first.ids[::-1]
    for got, want in zip(again.columns or [], first.columns or [], strict=True):
        assert np.array_equal(np.asarray(got), np.asarray(want)[::-1])
    stats = buffer.cache_stats()
    assert (stats.hits, stats.misses, stats.rows) == (16, 10, 10)
    more = buffer.storage.key_index()["key"][:14]  # 10 held, 4 read and kept now
    mixed = buffer.storage.fetch(more[::-1], FIELDS.paths)
    assert mixed.ids == buffer.storage.fetch(more[::-1], FIELDS.paths).ids
    assert buffer.cache_stats().hits == 40 and buffer.cache_stats().hit_rate == 40 / 54
    # A converter reading fewer fields is served by the same entries; one reading another
    # field reads only that row's fields again, into the same entry.
    buffer.storage.fetch(keys[:3], ["exp_data.state.i"])
    assert buffer.cache_stats().hits == 43
    buffer.storage.fetch(keys[:3], ["exp_data.state.url"])
    assert buffer.cache_stats().misses == 17 and buffer.cache_stats().rows == 14


@pytest.mark.parametrize("sampler_name", ["uniform", "prioritized", "recency"])
def test_seeded_samples_equal_those_without_a_cache(
    db_url: str, buffer_name: str, sampler_name: str
) -> None:
    make = {
        "uniform": lambda: UniformSampler(seed=7),
        "prioritized": lambda: PrioritizedSampler(seed=7),
        "recency": lambda: RecencySampler(seed=7),
    }[sampler_name]
    cached, plain = _pair(db_url, buffer_name)
    with cached, plain:
        cached.store_batch(make_rows(50, tensor=True))
        a, b = make(), make()
        for _ in range(12):  # rows repeat within and across batches: hits and misses mixed
            assert _same_batch(
                cached.sample(a, None, FIELDS, 16), plain.sample(b, None, FIELDS, 16)
            )
            assert a.last_ids == b.last_ids
            whole_a, whole_b = cached.sample(a, None, None, 8), plain.sample(b, None, None, 8)
            assert whole_a == whole_b and all(r.id for r in whole_a)
        assert cached.cache_stats().hits > 0
        assert plain.cache_stats().budget_bytes == 0


def test_batches_are_the_callers_own(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(4, tensor=True))
    keys = buffer.storage.key_index()["key"]
    # Read (kept as read), served again (decoded, then kept decoded), served from that:
    # each time the caller's own rows.
    for _ in range(4):
        rows = buffer.storage.fetch(np.r_[keys, keys[:1]]).rows
        assert rows is not None and len(rows) == 5
        assert rows[0].exp_data.state["obs"].tolist() == [0.0] * 8
        assert rows[0].exp_data.state["url"] == "https://x/0" and rows[0].exp_meta.step == 0
        rows[0].exp_data.state["obs"][:] = -1  # writable, and its own
        rows[0].exp_data.state["url"] = "changed"
        rows[0].exp_meta.step = 99
        rows[0].exp_data.actions.append("x")
    assert buffer.cache_stats().hits == 12  # (kept on the first read, hit from the second)
    # Fields: writable arrays when asked, and lists of copies.
    many = NumpyConverter({"s": "exp_data.state"})
    for _ in range(2):
        fetched = buffer.storage.fetch(np.r_[keys, keys], many.paths + FIELDS.paths)
        assert fetched.columns is not None
        state, obs = fetched.columns[0], fetched.columns[1]
        assert isinstance(obs, np.ndarray) and obs.flags.writeable and obs.shape == (8, 8)
        obs[:] = 5
        state[0]["url"] = "changed"
        state[0]["obs"][:] = 7
        # (a row twice in one batch may be one object, as without a cache)
    fetched = buffer.storage.fetch(keys, many.paths + FIELDS.paths, writable=False)
    assert fetched.columns is not None
    assert fetched.columns[0][0]["url"] == "https://x/0"
    assert fetched.columns[1][0].tolist() == [0.0] * 8
    # Arrays handed out read-only (writable=False, not stacked) cannot be made writable.
    ragged = make_row("r", "agent0", 9, state={"obs": np.ones(3, np.float32)})
    buffer.store(ragged)
    both = [*keys[:1], buffer.storage.key_index()["key"][-1]]
    for _ in range(2):
        (obs,) = buffer.storage.fetch(both, ["exp_data.state.obs"], writable=False).columns or []
        assert isinstance(obs, list) and not obs[0].flags.writeable
        with pytest.raises(ValueError):
            obs[0].flags.writeable = True
    assert buffer.cache_stats().hits >= 2


def test_the_cache_stays_within_its_budget(db_url: str, buffer_name: str) -> None:
    with ReplayBuffer(db_url, name=buffer_name, cache_bytes=20_000) as buf:
        buf.store_batch(make_rows(200, tensor=True))
        keys = buf.storage.key_index()["key"]
        for start in range(0, 200, 25):
            for _ in range(2):  # (a row is kept when it is read again)
                fetched = buf.storage.fetch(keys[start : start + 25], FIELDS.paths)
                assert fetched.ids and buf.cache_stats().bytes <= 20_000
        stats = buf.cache_stats()
        assert stats.evictions > 0 and 0 < stats.rows < 200
        # The most recent rows are held; the first ones went.
        buf.storage.fetch(keys[-5:], FIELDS.paths)
        assert buf.cache_stats().hits == stats.hits + 5
        # A row larger than the whole budget is returned and not kept.
        big = make_row("big", "agent0", 0, state={"obs": np.zeros(10_000, np.float32)})
        buf.store(big)
        key = buf.storage.key_index()["key"][-1]
        (value,) = buf.storage.fetch([key], ["exp_data.state.obs"]).columns or []
        assert value.shape == (1, 10_000)
        assert buf.cache_stats().bytes <= 20_000
        buf.storage.fetch([key], ["exp_data.state.obs"])
        assert buf.cache_stats().misses == stats.misses + 2
        # Off: nothing kept; bad budgets refused.
        buf.sql.set_cache_bytes(0)
        assert buf.cache_stats().rows == 0
        with pytest.raises(InvalidArgumentError, match="cache_bytes"):
            buf.sql.set_cache_bytes(-1)
    with pytest.raises(ExpstoreError, match="cache_bytes"):
        ReplayBuffer(db_url, name=buffer_name, cache_bytes="lots")  # type: ignore[arg-type]


def _versioned(i: int, version: int) -> DataRow:
    state = {"i": i, "obs": np.full(8, i, np.float32)}
    return make_row(f"task{i % 4}", "agent0", i, version=version, state=state)


def test_deleted_stale_and_spent_rows_never_come_from_the_cache(
    db_url: str, buffer_name: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buf:
        buf.set_policy_version(0)
        buf.store_batch([_versioned(i, 0) for i in range(40)])
        everything = buf.storage.key_index()["key"]
        buf.storage.fetch(everything, FIELDS.paths)  # the whole buffer in the cache
        buf.storage.fetch(everything)
        gone = [r.id for r in buf.query() if r.exp_data.state["i"] % 2]
        buf.delete(QueryBuilder().in_("id", gone).build())
        sampler = UniformSampler(seed=1)
        for _ in range(10):
            buf.sample(sampler, None, FIELDS, 16)
            assert not set(sampler.last_ids) & set(gone)
            assert not {r.id for r in buf.sample(sampler, None, None, 16)} & set(gone)
        assert buf.cache_stats().hits > 0
        # Stale: rows of version 0 once the policy is at 2 and max_staleness=1.
        buf.set_policy_version(2)
        fresh = [_versioned(100 + i, 2) for i in range(6)]
        buf.store_batch(fresh)
        stale = UniformSampler(seed=2, max_staleness=1)
        for _ in range(5):
            buf.sample(stale, None, FIELDS, 8)
            assert set(stale.last_ids) <= {r.id for r in fresh}
        # Spent: consume_after=1 returns each row once in all, cached or not.
        once = UniformSampler(seed=3, consume_after=1)
        seen: list[str] = []
        for _ in range(30):
            try:
                buf.sample(once, None, FIELDS, 4)
            except ExpstoreError:
                break
            seen += once.last_ids
        assert len(seen) == len(set(seen)) == len(buf)


def test_claimed_rows_never_come_from_the_cache(db_url: str, buffer_name: str) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as a, ReplayBuffer(db_url, name=buffer_name) as b:
        a.store_batch(make_rows(20, tensor=True))
        for buf in (a, b):  # both handles hold every row
            buf.storage.fetch(buf.storage.key_index()["key"])
        taken: list[str] = []
        for _ in range(5):
            for buf in (a, b):
                claim = buf.claim(2, consumer="learner")
                taken += [r.id for r in claim.batch]
                assert claim.ids == [r.id for r in claim.batch]
                claim.ack()
        assert len(taken) == len(set(taken)) == 20


def test_a_database_made_anew_empties_the_cache(tmp_path: Path) -> None:
    path = tmp_path / "anew.db"
    url = f"sqlite:///{path}"
    with ReplayBuffer(url, name="b") as buf:
        buf.store_batch(make_rows(5, tensor=True))
        buf.storage.fetch(buf.storage.key_index()["key"], FIELDS.paths)
        buf.storage.fetch(buf.storage.key_index()["key"], FIELDS.paths)
        assert buf.cache_stats().rows == 5
        path.unlink()
        buf.storage.close()
        with ReplayBuffer(url, name="b") as other:  # another database, keys from 1 again
            other.store_batch(
                [
                    make_row(
                        "new", "agent0", i, state={"i": 100 + i, "obs": np.ones(8, np.float32)}
                    )
                    for i in range(5)
                ]
            )
        time.sleep(0.01)
        batch = buf.sample(UniformSampler(seed=0), None, FIELDS, 5)
        assert set(batch["i"].tolist()) <= set(range(100, 105))
        assert buf.cache_stats().resets == 1


def test_rows_as_cached_decode_like_rows_read(buffer: ReplayBuffer) -> None:
    """Whole rows are kept as read and decoded afresh: messages, actions and arrays by
    digest included."""
    rows = [
        DataRow.model_validate(
            {
                "exp_meta": {"task_id": "t", "agent_id": "a", "step": i},
                "exp_data": {
                    "state": {"img": np.full((128, 128, 8), i, np.uint8)},  # by digest (128 KiB)
                    "actions": [{"click": [i, i]}],
                    "messages": [{"role": "user", "content": f"m{i}"}],
                    "reward_t": 1.0,
                },
            }
        )
        for i in range(3)
    ]
    buffer.store_batch(rows)
    keys = buffer.storage.key_index()["key"]
    assert buffer.array_stats()[0] == 3  # the images are stored by digest
    cold = buffer.storage.fetch(keys).rows
    for _ in range(3):  # kept as read, then its first hit decodes it, the next copy it
        warm = buffer.storage.fetch(keys).rows
        assert cold is not None and warm is not None
        for c, w, r in zip(cold, warm, rows, strict=True):
            assert c == w and w.id == r.id
            assert np.array_equal(w.exp_data.state["img"], r.exp_data.state["img"])
            assert w.exp_data.state["img"] is not c.exp_data.state["img"]
    assert buffer.cache_stats().hits == 9


def test_values_stay_right_as_rows_come_and_go(db_url: str, buffer_name: str) -> None:
    """Rows forgotten (CLOCK) and their slots given to others, paths added to rows held,
    repeats, mixed batches of held and read rows: every batch equals one read without a
    cache."""
    rows = [
        make_row(
            f"t{i % 5}",
            "agent0",
            i,
            reward=float(i) / 3,
            state={"obs": np.full(16, i, np.float32), "i": i, "tag": {"n": [i]}},
        )
        for i in range(120)
    ]
    cached, plain = _pair(db_url, buffer_name, cache_bytes=15_000)
    with cached, plain:
        cached.store_batch(rows)
        keys = cached.storage.key_index()["key"]
        rng = np.random.default_rng(3)
        paths_sets = [FIELDS.paths, ["exp_data.state.obs"], ["exp_data.state.tag", "reward_t"]]
        for n in range(150):
            chosen = keys[rng.integers(0, 40 if n % 3 else 120, 12)]
            paths = paths_sets[n % 3]
            writable = bool(n % 2)
            got = cached.storage.fetch(chosen, paths, writable=writable)
            want = plain.storage.fetch(chosen, paths, writable=writable)
            assert got.ids == want.ids
            for a, b in zip(got.columns or [], want.columns or [], strict=True):
                assert type(a) is type(b)
                assert [np.asarray(v).tolist() if isinstance(v, np.ndarray) else v for v in a] == [
                    np.asarray(v).tolist() if isinstance(v, np.ndarray) else v for v in b
                ]
            stats = cached.cache_stats()
            assert stats.bytes <= 15_000
        assert stats.hits > 100 and stats.evictions > 100, stats


def test_text_is_counted_by_what_it_takes(buffer: ReplayBuffer) -> None:
    """A string of wide characters takes 2-4 bytes a character: the budget counts that."""
    text = "\u6587\u5b57\U0001f600" * 3000
    buffer.store(make_row("t", "agent0", 0, state={"text": text}))
    key = buffer.storage.key_index()["key"][-1]
    for _ in range(2):  # read, then decoded on its first hit
        buffer.storage.fetch([key])
    assert buffer.cache_stats().bytes >= sys.getsizeof(text)


def test_values_come_in_the_form_the_database_gave(buffer: ReplayBuffer) -> None:
    """A path the database cannot follow (a key with a quote) comes as a list of arrays,
    not stacked: the same from the cache."""
    buffer.store_batch(
        [make_row("t", "agent0", i, state={'a"b': np.full(3, i, np.float32)}) for i in range(4)]
    )
    keys = buffer.storage.key_index()["key"]
    path = ['exp_data.state.a"b']
    cold = (buffer.storage.fetch(keys, path).columns or [])[0]
    buffer.storage.fetch(keys, path)  # served from the cache
    warm = (buffer.storage.fetch(keys, path).columns or [])[0]
    assert buffer.cache_stats().hits == 8
    assert type(cold) is type(warm)
    assert [np.asarray(v).tolist() for v in cold] == [np.asarray(v).tolist() for v in warm]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_another_thread_holds_the_cache_can_fetch(tmp_path: Path) -> None:
    with ReplayBuffer(f"sqlite:///{tmp_path / 'f.db'}", name="b") as buf:
        buf.store_batch(make_rows(10))
        keys = buf.storage.key_index()["key"]
        buf.storage.fetch(keys)
        lock = buf.sql.row_cache._lock
        held, release = threading.Event(), threading.Event()

        def prefetching() -> None:  # a draw inside the cache's lock at the fork
            with lock:
                held.set()
                release.wait()

        threading.Thread(target=prefetching, daemon=True).start()
        held.wait()
        child = mp.get_context("fork").Process(target=_fetch_all, args=(buf,))
        child.start()
        release.set()
        child.join(120)
        if child.is_alive():
            child.kill()
        assert child.exitcode == 0


def _fetch_all(buf: ReplayBuffer) -> None:
    rows = buf.storage.fetch(buf.storage.key_index()["key"]).rows
    assert rows is not None and len(rows) == 10


def test_no_keys_give_no_rows(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(3, tensor=True))
    for paths in (FIELDS.paths, None):
        fetched = buffer.storage.fetch(np.array([], np.int64), paths)
        assert fetched.ids == []
        assert fetched.columns is None or all(len(c) == 0 for c in fetched.columns)


def test_the_cache_itself() -> None:
    cache = RowCache(0)
    assert not cache.enabled
    with pytest.raises(InvalidArgumentError):
        RowCache(-5)
    cache = RowCache(10_000)
    calls: list[list[int]] = []

    def read(keys: list[int], paths: Any, writable: bool) -> tuple[list[str], list[Any]]:
        calls.append(keys)
        return [f"id{k}" for k in keys], [np.stack([np.full(4, k) for k in keys])]

    ids, cols, hits = cache.fetch_columns("e", [1, 2, 2, 3], ["p"], True, read)
    assert ids == ["id1", "id2", "id2", "id3"] and cols[0][:, 0].tolist() == [1, 2, 2, 3]
    assert calls == [[1, 2, 2, 3]] and hits == [] and cache.stats().rows == 3  # room: kept
    ids, cols, hits = cache.fetch_columns("e", [3, 4], ["p"], True, read)
    assert calls[-1] == [4] and hits == [(3, "id3")] and ids == ["id3", "id4"]
    assert cols[0][:, 0].tolist() == [3, 4] and cache.stats().rows == 4
    cache.fetch_columns("other", [3], ["p"], True, read)  # another epoch: emptied first
    assert calls[-1] == [3] and cache.stats().resets == 1 and cache.stats().rows == 1


def test_a_cache_half_full_keeps_a_row_on_its_second_read() -> None:
    """The doorkeeper: once what the cache holds passes half of what it may hold, a row
    read for the first time is only noted, and kept when read again (rows drawn once in a
    long while from a buffer larger than the budget would only churn it)."""
    cache = RowCache(10_000)

    def read(keys: list[int], paths: Any, writable: bool) -> tuple[list[str], list[Any]]:
        return [f"id{k}" for k in keys], [np.stack([np.full(4, k) for k in keys])]

    key = 0
    while cache.stats().bytes < (10_000 - 10_000 // 8) // 2:  # fill past half the limit
        cache.fetch_columns("e", [key], ["p"], True, read)
        key += 1
    held = cache.stats().rows
    assert held == key  # each kept on its first read until then
    cache.fetch_columns("e", [1000, 1001], ["p"], True, read)
    assert cache.stats().rows == held  # noted, not kept
    _, cols, hits = cache.fetch_columns("e", [1000, 0], ["p"], True, read)
    assert hits == [(0, "id0")] and cols[0][:, 0].tolist() == [1000, 0]
    assert cache.stats().rows == held + 1  # kept on its second read
    _, _, hits = cache.fetch_columns("e", [1000], ["p"], True, read)
    assert hits == [(1000, "id1000")]


# -- processes deleting, evicting, claiming and setting versions while one samples --------
def _disturb(url: str, name: str, log: str, seconds: float) -> None:
    """Delete, evict (writes over capacity), claim and raise the policy version, logging
    when each change had committed (monotonic clock, shared by processes on one host)."""
    rng = np.random.default_rng(0)
    with ReplayBuffer(url, name=name) as buf, open(log, "a") as out:
        end = time.monotonic() + seconds
        version = 0
        step = 0
        while time.monotonic() < end:
            op = step % 4
            step += 1
            if op == 0:
                ids = [r.id for r in buf.query(limit=200)]
                doomed = [i for i in ids if rng.random() < 0.05]
                if doomed:
                    buf.delete(QueryBuilder().in_("id", doomed).build())
                    out.write("".join(f"deleted {i} {time.monotonic()}\n" for i in doomed))
            elif op == 1:
                version += 1
                buf.set_policy_version(version)
                out.write(f"version {version} {time.monotonic()}\n")
            elif op == 2:
                buf.store_batch(
                    [
                        make_row(
                            f"w{step}",
                            "agent0",
                            i,
                            state={"i": step * 100 + i, "obs": np.full(8, i, np.float32)},
                            version=version,
                        )
                        for i in range(20)
                    ]
                )
                lowest = int(buf.storage.key_index()["key"][0])
                out.write(f"lowest {lowest} {time.monotonic()}\n")
            else:
                claim = buf.claim(5, consumer="shared")
                out.write("".join(f"claimed {i} {time.monotonic()}\n" for i in claim.ids))
                claim.ack()
            out.flush()


def test_under_concurrent_changes_no_row_the_database_would_not_choose(
    db_url: str, buffer_name: str, tmp_path: Path
) -> None:
    log = tmp_path / "changes.log"
    with ReplayBuffer(db_url, name=buffer_name, capacity=400) as buf:
        buf.set_policy_version(0)
        buf.store_batch(
            [
                make_row(
                    f"t{i // 10}",
                    "agent0",
                    i % 10,
                    state={"i": i, "obs": np.full(8, i % 10, np.float32)},
                    version=0,
                )
                for i in range(400)
            ]
        )
        proc = mp.get_context("spawn").Process(
            target=_disturb, args=(db_url, buffer_name, str(log), 6.0)
        )
        proc.start()
        samples: list[tuple[float, list[str], list[int], list[float]]] = []
        claimed: list[str] = []
        sampler = UniformSampler(seed=5, max_staleness=3)
        conv = NumpyConverter({"i": "exp_data.state.i", "v": "exp_meta.policy_version"})
        started = time.monotonic()
        while proc.is_alive() or time.monotonic() - started < 1:
            at = time.monotonic()
            try:
                batch = buf.sample(sampler, None, conv, 32)
                samples.append(
                    (at, sampler.last_ids, sampler.last_keys.tolist(), batch["v"].tolist())
                )
                rows = buf.sample(sampler, None, None, 8)
                samples.append(
                    (
                        at,
                        [r.id for r in rows],
                        [],
                        [float(r.exp_meta.policy_version or 0) for r in rows],
                    )
                )
                claim = buf.claim(3, consumer="shared")
                claimed += claim.ids
                claim.ack()
            except ExpstoreError:  # an empty or stale buffer for a moment
                continue
        proc.join(timeout=60)
        assert proc.exitcode == 0
        assert buf.cache_stats().hits > 0
    deleted: dict[str, float] = {}
    versions: list[tuple[float, int]] = []
    lowest: list[tuple[float, int]] = []
    for line in log.read_text().splitlines():
        kind, what, when = line.split()
        if kind == "deleted":
            deleted[what] = float(when)
        elif kind == "version":
            versions.append((float(when), int(what)))
        elif kind == "lowest":
            lowest.append((float(when), int(what)))
        elif kind == "claimed":
            claimed.append(what)
    assert deleted and versions and lowest
    assert len(claimed) == len(set(claimed))  # each row claimed once, by either process
    for at, ids, keys, row_versions in samples:
        # Nothing deleted, evicted or stale before the sample began.
        assert not [i for i in ids if deleted.get(i, at) < at]
        floor = max([k for t, k in lowest if t < at], default=0)
        assert all(k >= floor for k in keys)
        current = max([v for t, v in versions if t < at], default=0)
        assert all(v >= current - 3 for v in row_versions)
