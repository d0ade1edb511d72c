"""ExpstoreStorage against TorchRL's contract: every test runs the same operations on a
LazyTensorStorage and on an ExpstoreStorage (SQLite and Postgres) and compares what
they give, bit for bit."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrl")
from tensordict import TensorDict  # noqa: E402
from torch.utils import _pytree  # noqa: E402
from torchrl.data import (  # noqa: E402
    LazyTensorStorage,
    PrioritizedReplayBuffer,
    ReplayBuffer,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers import (  # noqa: E402
    PrioritizedSampler,
    RandomSampler,
    RoundRobinWriter,
    SamplerWithoutReplacement,
    SliceSampler,
)

from expstore import QueryBuilder  # noqa: E402
from expstore import ReplayBuffer as ExpBuffer  # noqa: E402
from expstore.errors import (  # noqa: E402
    ExpstoreError,
    InvalidArgumentError,
    OutOfRangeError,
    UnsupportedTypeError,
)
from expstore.integrations.torchrl import ExpstoreStorage  # noqa: E402

Factory = Callable[[int], Any]

# TorchRL's prioritized sampler runs on its C++ segment trees; torchrl 0.14.1's extension
# does not load against torch 2.13 (an undefined symbol), so it is None there.
_trees = __import__("torchrl.data.replay_buffers.samplers.prioritized", fromlist=["x"])
needs_segment_trees = pytest.mark.skipif(
    _trees.SumSegmentTreeFp32 is None,
    reason="torchrl's C++ extension (segment trees) does not load with this torch build",
)


@pytest.fixture
def storages(db_url: str, buffer_name: str) -> tuple[Factory, Factory]:
    """(a LazyTensorStorage factory, an ExpstoreStorage factory on the test's backend)."""
    made = [0]

    def expstore_storage(max_size: int) -> ExpstoreStorage:
        made[0] += 1
        return ExpstoreStorage(max_size, url=db_url, name=f"{buffer_name}_{made[0]}")

    return LazyTensorStorage, expstore_storage


def assert_same(a: Any, b: Any) -> None:
    """Equal structure, and every leaf of equal dtype, shape, device and bits."""
    if isinstance(a, TensorDict) or isinstance(b, TensorDict):
        assert type(a) is type(b)
        assert a.batch_size == b.batch_size
        keys_a = sorted(map(str, a.keys(include_nested=True, leaves_only=True)))
        keys_b = sorted(map(str, b.keys(include_nested=True, leaves_only=True)))
        assert keys_a == keys_b
        for key in a.keys(include_nested=True, leaves_only=True):
            assert_same(a.get(key), b.get(key))
        return
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device)
        bits_a = a.contiguous().reshape(-1).view(torch.uint8)
        bits_b = b.contiguous().reshape(-1).view(torch.uint8)
        assert torch.equal(bits_a, bits_b)
        return
    leaves_a, spec_a = _pytree.tree_flatten(a)
    leaves_b, spec_b = _pytree.tree_flatten(b)
    assert spec_a == spec_b
    for x, y in zip(leaves_a, leaves_b, strict=True):
        assert_same(x, y)


def rich_td(n: int, start: int = 0) -> TensorDict:
    """n elements with nested keys, a batch dimension of 2 per element and many dtypes."""
    g = torch.Generator().manual_seed(start)
    return TensorDict(
        {
            "obs": torch.randn(n, 2, 3, generator=g),
            "pixels": torch.randint(0, 255, (n, 2, 4, 4), generator=g, dtype=torch.uint8),
            "action": torch.randint(0, 5, (n, 2), generator=g),
            ("next", "reward"): torch.randn(n, 2, 1, generator=g).to(torch.bfloat16),
            ("next", "done"): torch.rand(n, 2, 1, generator=g) > 0.5,
            ("next", "deep", "x"): torch.randn(n, 2, generator=g, dtype=torch.float64),
            "half": torch.randn(n, 2, generator=g).half(),
            "step": torch.arange(start, start + n).repeat_interleave(2).reshape(n, 2),
        },
        batch_size=[n, 2],
    )


def test_round_robin_overwrite_and_reads_match_lazy_tensor_storage(storages) -> None:
    results = []
    for make in storages:
        rb = TensorDictReplayBuffer(storage=make(8), writer=RoundRobinWriter(), batch_size=4)
        written = [rb.extend(rich_td(n, start)) for n, start in ((3, 0), (4, 10), (5, 20))]
        storage = rb.storage
        results.append(
            (
                written,
                len(storage),
                storage[:],
                storage[3],
                storage[torch.tensor([[7, 0], [2, 2]])],
                storage[-1],
                rb.writer._cursor,
                storage._last_cursor_index,
                storage.contains(7),
                storage.contains(8),
            )
        )
    lazy, ours = results
    for x, y in zip(lazy, ours, strict=True):
        if isinstance(x, list):
            for u, v in zip(x, y, strict=True):
                assert_same(u, v)
        elif isinstance(x, (torch.Tensor, TensorDict)):
            assert_same(x, y)
        else:
            assert x == y


def test_a_batch_longer_than_the_storage_keeps_its_last_elements(storages) -> None:
    got = []
    for make in storages:
        rb = ReplayBuffer(storage=make(4), batch_size=2)
        rb.extend(torch.arange(10, dtype=torch.int16))
        got.append(rb.storage[:])
    assert_same(*got)


def test_tensors_and_pytrees_come_back_bit_for_bit(storages) -> None:
    tree = {
        "obs": torch.tensor([[1.5, float("nan")], [-0.0, float("inf")]]),
        "pair": (torch.tensor([1, 2], dtype=torch.int8), torch.tensor([True, False])),
        "bf": torch.tensor([[0.1], [3.0]], dtype=torch.bfloat16),
    }
    got = []
    for make in storages:
        rb_tree = ReplayBuffer(storage=make(5), batch_size=2)
        rb_tree.extend(tree)
        rb_tensor = ReplayBuffer(storage=make(5), batch_size=2)
        rb_tensor.extend(torch.randn(3, 2, 2, generator=torch.Generator().manual_seed(1)))
        rb_tensor.add(torch.full((2, 2), 7.0))
        got.append((rb_tree.storage[:], rb_tree.storage[1], rb_tensor.storage[:]))
    for x, y in zip(*got, strict=True):
        assert_same(x, y)


def test_a_list_of_elements_is_stored_as_a_batch(storages) -> None:
    got = []
    for make in storages:
        rb = ReplayBuffer(storage=make(6), batch_size=2)
        rb.extend([torch.tensor([i, i + 1]) for i in range(3)])
        got.append(rb.storage[:])
    assert_same(*got)


SAMPLERS: dict[str, Callable[[], Any]] = {
    "random": RandomSampler,
    "without_replacement": SamplerWithoutReplacement,
    "slice": lambda: SliceSampler(slice_len=4, traj_key="episode"),
}


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_samplers_draw_the_same_batches(storages, sampler: str) -> None:
    got = []
    for make in storages:
        rb = TensorDictReplayBuffer(storage=make(40), sampler=SAMPLERS[sampler](), batch_size=8)
        for e in range(4):
            data = TensorDict(
                {"obs": torch.arange(10.0) + 100 * e, "episode": torch.full((10,), e)},
                batch_size=[10],
            )
            rb.extend(data)
        torch.manual_seed(0)
        got.append([rb.sample() for _ in range(3)])
    for x, y in zip(*got, strict=True):
        assert_same(x, y)


def _seed(n: int) -> None:
    """Seed what TorchRL's samplers draw with: torch's generator, and numpy's global one
    (``PrioritizedSampler`` without a generator of its own draws its masses with
    ``np.random.uniform``)."""
    torch.manual_seed(n)
    np.random.seed(n)  # noqa: NPY002 - TorchRL's sampler reads the global state


@needs_segment_trees
@pytest.mark.parametrize("tensordict", [False, True])
def test_prioritized_buffers_sample_and_update_alike(storages, tensordict: bool) -> None:
    got = []
    for make in storages:
        if tensordict:
            rb: Any = TensorDictPrioritizedReplayBuffer(
                alpha=0.7, beta=0.5, storage=make(16), batch_size=6, priority_key="td_error"
            )
            rb.extend(TensorDict({"obs": torch.arange(12.0)}, batch_size=[12]))
        else:
            rb = PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=make(16), batch_size=6)
            rb.extend(torch.arange(12.0))
        _seed(0)
        first = rb.sample(return_info=True) if not tensordict else rb.sample()
        if tensordict:
            first.set("td_error", torch.arange(6.0) + 1)
            rb.update_tensordict_priority(first)
        else:
            rb.update_priority(first[1]["index"], torch.arange(6.0) + 1)
        second = rb.sample(return_info=True) if not tensordict else rb.sample()
        got.append((first, second))
    for x, y in zip(*got, strict=True):
        assert_same(x, y)


@needs_segment_trees
def test_prioritized_sampler_under_a_plain_replay_buffer(storages) -> None:
    got = []
    for make in storages:
        rb = ReplayBuffer(
            storage=make(10), sampler=PrioritizedSampler(10, alpha=1.0, beta=1.0), batch_size=5
        )
        idx = rb.extend(torch.arange(10))
        rb.update_priority(idx, torch.linspace(0.1, 5.0, 10))
        _seed(3)
        got.append(rb.sample(return_info=True))
    assert_same(*got)


def test_state_dict_and_dumps_reopen_the_same_rows(storages, tmp_path: Path) -> None:
    lazy_make, make = storages
    rb = TensorDictReplayBuffer(storage=make(8), batch_size=4)
    rb.extend(rich_td(6))
    rb.dumps(tmp_path / "ckpt")
    state = rb.state_dict()

    again = TensorDictReplayBuffer(storage=make(8), batch_size=4)
    again.loads(tmp_path / "ckpt")
    assert_same(again.storage[:], rb.storage[:])
    assert again.writer._cursor == rb.writer._cursor == 6
    assert again.storage._last_cursor_index == 5

    third = TensorDictReplayBuffer(storage=make(8), batch_size=4)
    third.load_state_dict(state)
    assert len(third) == 6
    third.extend(rich_td(3, start=50))  # the cursor went on from 6: slots 6, 7, 0
    lazy = TensorDictReplayBuffer(storage=lazy_make(8), batch_size=4)
    lazy.extend(rich_td(6))
    lazy.extend(rich_td(3, start=50))
    assert_same(third.storage[:], lazy.storage[:])
    assert_same(rb.storage[:], lazy.storage[:])  # the same rows, seen from the first handle


def test_empty_clears_the_slots(storages) -> None:
    for make in storages:
        rb = ReplayBuffer(storage=make(4), batch_size=2)
        rb.extend(torch.arange(3))
        revision = rb.storage._mutation_revision
        rb.empty()
        assert len(rb) == 0
        assert rb.storage._mutation_revision > revision
        rb.extend(torch.arange(5, 7))
        assert rb.storage[:].tolist() == [5, 6]


def test_rows_are_expstore_rows_and_outlive_the_process_handle(db_url: str, buffer_name) -> None:
    storage = ExpstoreStorage(5, url=db_url, name=buffer_name)
    storage.policy_version = 3
    rb = ReplayBuffer(storage=storage, batch_size=2)
    rb.extend(torch.arange(7))
    with ExpBuffer(db_url, name=buffer_name) as buffer:
        assert buffer.count() == 5
        steps = sorted(r.exp_meta.step for r in buffer.get_by_task_id("slots"))
        assert steps == [0, 1, 2, 3, 4]
        assert {r.exp_meta.policy_version for r in buffer.get_by_task_id("slots")} == {3}
    fresh = ExpstoreStorage(5, url=db_url, name=buffer_name)
    assert fresh[:].tolist() == [5, 6, 2, 3, 4]


def test_errors_say_what_to_do(db_url: str, buffer_name: str) -> None:
    with pytest.raises(InvalidArgumentError, match="max_size must be a positive int"):
        ExpstoreStorage(0, url=db_url, name=buffer_name)
    storage = ExpstoreStorage(4, url=db_url, name=buffer_name)
    with pytest.raises(OutOfRangeError, match=r"slots must be in \[0, 4\)"):
        storage.set([5], torch.zeros(1))
    with pytest.raises(InvalidArgumentError, match="2 slots and a batch of 3"):
        storage.set([0, 1], torch.zeros(3))
    storage.set([0, 1], torch.zeros(2))
    with pytest.raises(OutOfRangeError, match=r"slots \[3\] .* hold nothing"):
        storage.get([0, 3])
    with pytest.raises(UnsupportedTypeError, match="stores tensors, TensorDicts and pytrees"):
        storage.set([2], ["text"])
    with pytest.raises(ExpstoreError):
        storage.contains("x")


def _write(rb: ReplayBuffer, worker: int) -> None:
    for batch in range(3):
        rb.extend(torch.arange(5) + 1000 * worker + 10 * batch)


def test_two_processes_write_one_buffer(db_url: str, buffer_name: str) -> None:
    rb = ReplayBuffer(storage=ExpstoreStorage(100, url=db_url, name=buffer_name), shared=True)
    rb.extend(torch.arange(5) + 9000)  # the parent writes too
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_write, args=(rb, w)) for w in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    expected = sorted(
        [9000 + i for i in range(5)]
        + [1000 * w + 10 * b + i for w in (1, 2) for b in range(3) for i in range(5)]
    )
    assert len(rb) == 35
    assert sorted(rb.storage[:].tolist()) == expected
    assert rb.writer._cursor == 35  # TorchRL's shared cursor moved in every process
    reopened = ExpstoreStorage(100, url=db_url, name=buffer_name)
    assert sorted(reopened[:].tolist()) == expected


def test_the_codec_reads_what_the_blob_path_reads(db_url: str, buffer_name: str) -> None:
    """A batch whose rows the blob layout cannot cut (another layout, a damaged blob) is
    read through the codec: the same elements."""
    storage = ExpstoreStorage(8, url=db_url, name=buffer_name)
    rb = TensorDictReplayBuffer(storage=storage, batch_size=4)
    rb.extend(rich_td(6))
    index = torch.tensor([5, 0, 0, 3])
    fast = storage[index]
    storage._layout.plan = ()  # as when a leaf is not a plain tensor in the blob
    assert_same(storage[index], fast)


def test_a_storage_reads_what_another_handle_wrote_or_deleted_since(
    db_url: str, buffer_name: str
) -> None:
    """Two handles on one buffer (as two processes): each keeps which row each slot holds
    and the rows it wrote in its row cache, and still reads what the other did since:
    slots filled, slots overwritten, rows deleted."""
    mine = ExpstoreStorage(8, url=db_url, name=buffer_name)
    other = ExpstoreStorage(8, url=db_url, name=buffer_name)
    first, filled, overwritten = torch.arange(4) * 1.5, torch.arange(2) + 100.0, -torch.ones(2)
    mine.set(list(range(4)), first)
    assert_same(mine.get([0, 1, 2, 3]), first)  # from this handle's own writes
    assert mine.buffer.sql.row_cache.stats().misses == 0
    other.set([4, 5], filled)  # rows added only
    assert_same(mine.get([5, 4, 0]), torch.stack([filled[1], filled[0], first[0]]))
    other.set([0, 1], overwritten)  # rows replaced
    for _ in range(3):  # read by slot, then (the buffer unchanged) by a map read anew
        assert_same(
            mine.get([1, 0, 3, 4]), torch.stack([*overwritten.flip(0), first[3], filled[0]])
        )
    other.buffer.delete(QueryBuilder().eq("step", 3).build())  # a row goes, no other comes
    with pytest.raises(OutOfRangeError, match=r"slots \[3\] .* hold nothing"):
        mine.get([2, 3])
    assert_same(mine.get([2]), first[2:3])
    mine.set([3], torch.tensor([7.0]))  # a write after another handle's: read back right
    assert_same(mine.get([3, 0]), torch.tensor([7.0, -1.0]))
    assert_same(other.get([3, 0]), torch.tensor([7.0, -1.0]))


def test_rows_a_retention_evicts_in_a_write_leave_their_slots(
    db_url: str, buffer_name: str
) -> None:
    """A write that also evicts other rows (the buffer's capacity) leaves those slots
    empty to this handle too (its map of the slots does not keep them)."""
    storage = ExpstoreStorage(8, url=db_url, name=buffer_name)
    storage.set(list(range(4)), torch.arange(4.0))
    assert_same(storage.get([0, 3]), torch.tensor([0.0, 3.0]))
    storage.buffer.set_retention(4)  # the oldest rows go as new ones come
    storage.set([4, 5], torch.tensor([4.0, 5.0]))
    with pytest.raises(OutOfRangeError, match=r"slots \[0\] .* hold nothing"):
        storage.get([0, 5])
    assert_same(storage.get([5, 2, 4, 3]), torch.tensor([5.0, 2.0, 4.0, 3.0]))
