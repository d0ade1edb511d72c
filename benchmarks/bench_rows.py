"""Benchmark: sampling whole rows (DataRows, AWorld's DefaultConverter path) against the
floor of the same fetch, measured in one run (issue: Ecosystem, item 2).

Rows: ``bench_sample.py``'s (a 1,024-element float32 tensor, ~4 KB, in
``exp_data.state.image_features``, task/agent/step metadata, a reward); its database is
built once and reused (``/tmp/expstore_bench_<rows>.db``; Postgres buffer
``bench_<rows>``). Timed, interleaved round-robin after a prewarm:

- ``sample``: ``buffer.sample(UniformSampler(), None, DefaultConverter(), 256)``, a list of
  DataRows with the tensor as a numpy array;
- the floor: numpy picks 256 keys from an array in memory; one ``SELECT`` of every column
  a row has ``WHERE key IN (...)`` on a raw DB-API connection; the document decoded
  (``json.loads``; psycopg decodes JSONB itself) and the tensor made by ``np.frombuffer``.

Target: sample ≤ 1.5x the floor. Also printed: where the time of one sample goes.

    python benchmarks/bench_rows.py [rows=100000] [--backends sqlite,postgres]
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sample import BATCH, DIM, Floor, _all_keys, build, interleaved, prewarm  # noqa: E402

from expstore import ReplayBuffer  # noqa: E402
from expstore.codec import HEADER_SIZE  # noqa: E402
from expstore.converters import DefaultConverter  # noqa: E402
from expstore.samplers import UniformSampler  # noqa: E402
from expstore.storage.reader import ROW_COLUMNS  # noqa: E402

_COLUMNS = [c.name for c in ROW_COLUMNS]


class RowFloor(Floor):
    """One raw SELECT of every column for 256 keys; JSON decode; np.frombuffer."""

    def __init__(self, buffer: ReplayBuffer) -> None:
        super().__init__(buffer)
        self.sqlite = self.mark == "?"
        self.data_at = _COLUMNS.index("data")
        self.tensors_at = _COLUMNS.index("tensors")

    def __call__(self, keys: np.ndarray, rng: np.random.Generator) -> list[Any]:  # type: ignore[override]
        chosen, fetched = self.fetch(keys, rng, ", ".join(_COLUMNS))
        found = {}
        for row in fetched:
            doc = json.loads(row[self.data_at]) if self.sqlite else row[self.data_at]
            tensor = np.frombuffer(row[self.tensors_at], np.float32, DIM, HEADER_SIZE)
            found[row[0]] = (row, doc, tensor)
        return [found[k] for k in chosen]


def run_backend(label: str, url: str, n: int, repeats: int) -> dict[str, float]:
    buffer = ReplayBuffer(url, name=f"bench_{n}")
    if buffer.count() != n:
        buffer.clear()
        print(f"{label}: building {n:,} rows ...", flush=True)
        build(buffer, n)
    prewarm(buffer, url)
    rng = np.random.default_rng(1)
    floor = RowFloor(buffer)
    sampler = UniformSampler(seed=0)
    converter = DefaultConverter()
    sample = partial(buffer.sample, sampler, None, converter, BATCH)
    got = sample()
    assert len(got) == BATCH and got[0].exp_data.state["image_features"].shape == (DIM,)
    results = interleaved(
        {"floor": partial(floor, _all_keys(buffer), rng), "sample": sample}, repeats
    )
    floor.close()
    keys = _all_keys(buffer)[rng.integers(0, n, BATCH)]
    storage = buffer.storage
    parts = interleaved(
        {
            "  part: fetch_keys(256) -> DataRows": partial(storage.fetch_keys, keys),
            "  part: rows_by_keys(256), not decoded": partial(
                storage._reader.rows_by_keys, list(dict.fromkeys(keys.tolist())), ROW_COLUMNS
            ),
        },
        repeats,
    )
    results.update(parts)
    buffer.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="?", type=int, default=100_000)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--repeats", type=int, default=100)
    args = parser.parse_args()
    urls = {"sqlite": f"sqlite:////tmp/expstore_bench_{args.rows}.db", "postgres": args.pg_url}
    print(f"sample({BATCH}) of whole rows (DataRows) over {args.rows:,} rows of {DIM} float32")
    for backend in args.backends.split(","):
        r = run_backend(backend, urls[backend], args.rows, args.repeats)
        print(f"\n== {backend} ==")
        for name, seconds in r.items():
            print(f"  {name:<44} {seconds * 1000:9.2f} ms")
        print(f"  sample / floor: {r['sample'] / r['floor']:.2f}x (target <= 1.5)")


if __name__ == "__main__":
    main()
