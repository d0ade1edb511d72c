"""Benchmark: sampling 256 rows from TorchRL's in-memory replay buffers against expstore's
``sample(256)``, same rows (100,000 rows with a 1,024-element float32 observation and a
reward), for the README's comparison (issue: Ecosystem, item 7).

TorchRL is not an expstore dependency; run the TorchRL half in an environment that has it
(``pip install torchrl``) and the expstore half where expstore is installed:

    python benchmarks/bench_vs_torchrl.py torchrl      # LazyTensorStorage, LazyMemmapStorage
    python benchmarks/bench_vs_torchrl.py expstore     # SQLite file and Postgres
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from functools import partial

import numpy as np
import torch

N, DIM, BATCH, REPEATS = 100_000, 1024, 256, 200


def _median_ms(fn) -> float:  # noqa: ANN001
    fn()
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def torchrl_half() -> None:
    from tensordict import TensorDict
    from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer

    data = TensorDict({"obs": torch.rand(N, DIM), "reward": torch.rand(N)}, batch_size=[N])
    with tempfile.TemporaryDirectory() as tmp:
        for label, storage in (
            ("LazyTensorStorage (RAM)", LazyTensorStorage(N)),
            ("LazyMemmapStorage (disk)", LazyMemmapStorage(N, scratch_dir=tmp)),
        ):
            rb = ReplayBuffer(storage=storage, batch_size=BATCH)
            rb.extend(data)
            print(f"TorchRL {label}: sample(256) {_median_ms(rb.sample):.3f} ms")


def expstore_half() -> None:
    from expstore import ReplayBuffer
    from expstore.converters import TensorConverter
    from expstore.samplers import UniformSampler

    rng = np.random.default_rng(0)
    converter = TensorConverter({"obs": "exp_data.state.obs", "reward": "exp_data.reward_t"})
    with tempfile.TemporaryDirectory() as tmp:
        for label, url in (
            ("SQLite file", f"sqlite:///{tmp}/cmp.db"),
            ("Postgres", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"),
        ):
            with ReplayBuffer(url, name="vs_torchrl") as buffer:
                buffer.clear()
                for start in range(0, N, 10_000):
                    obs = rng.random((10_000, DIM), dtype=np.float32)
                    buffer.extend(
                        {
                            "task_id": [f"t{(start + i) // 10}" for i in range(10_000)],
                            "agent_id": "a",
                            "step": 0,
                            "state": {"obs": obs},
                            "reward_t": rng.random(10_000),
                        }
                    )
                sampler = UniformSampler(seed=0)
                ms = _median_ms(partial(buffer.sample, sampler, None, converter, BATCH))
                print(f"expstore {label}: sample(256) through TensorConverter {ms:.3f} ms")
                buffer.clear()


if __name__ == "__main__":
    {"torchrl": torchrl_half, "expstore": expstore_half}[sys.argv[1]]()
