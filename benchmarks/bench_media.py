"""Screenshots in the store (issue 34): compression ratio per codec, store_batch MB/s,
warm sample(16), arrays stored once, and changed() against a plain indexed filter.

Real screenshots: HTML pages of Debian's ``python3-doc`` rendered at 1280x720 by headless
Chromium (``apt-get install chromium python3-doc``), cached as PNG files in ``--screens``
(default /work/scratch/screens; never in the repository). Not run in CI.

    python benchmarks/bench_media.py --pg postgresql+psycopg://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import fresh_pg_database  # noqa: E402

from expstore import DataRow, Experience, ExpMeta, NumpyConverter, ReplayBuffer  # noqa: E402
from expstore.codec.compression import pack_array  # noqa: E402
from expstore.codec.digests import array_digest  # noqa: E402
from expstore.query import Comparison, Condition  # noqa: E402
from expstore.samplers import UniformSampler  # noqa: E402
from expstore.storage.reader import RowReader  # noqa: E402

DOCS = Path("/usr/share/doc/python3-doc/html/library")


def render(folder: Path, count: int) -> list[Path]:
    """``count`` python3-doc pages rendered at 1280x720 (cached in ``folder``)."""
    folder.mkdir(parents=True, exist_ok=True)
    pages = sorted(DOCS.glob("*.html"))[:: max(1, len(sorted(DOCS.glob("*.html"))) // count)]
    shots = []
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    for page in pages[:count]:
        shot = folder / f"{page.stem}.png"
        if not shot.exists():
            if chromium is None:
                sys.exit("chromium is not installed: apt-get install chromium python3-doc")
            subprocess.run(
                [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                 "--window-size=1280,720", f"--screenshot={shot}", page.as_uri()],
                check=True, capture_output=True, timeout=120,
            )  # fmt: skip
        shots.append(shot)
    return shots


def load(paths: list[Path]) -> list[np.ndarray]:
    from PIL import Image

    return [np.asarray(Image.open(p).convert("RGB")) for p in paths]


def ratios(images: list[np.ndarray]) -> list[tuple[str, float, float]]:
    """(codec, stored/raw, MB/s of raw pixels compressed) over the images."""
    import blosc2
    import zstandard
    from PIL import Image

    raw = sum(a.nbytes for a in images)

    def png(a: np.ndarray, level: int) -> bytes:
        out = io.BytesIO()
        Image.fromarray(a).save(out, "PNG", compress_level=level)
        return out.getvalue()

    def webp(a: np.ndarray) -> bytes:
        out = io.BytesIO()
        Image.fromarray(a).save(out, "WEBP", lossless=True, quality=0, method=0)
        return out.getvalue()

    codecs: dict[str, Any] = {
        "zstd level 1": zstandard.ZstdCompressor(level=1).compress,
        "zstd level 3 (expstore's)": zstandard.ZstdCompressor(level=3).compress,
        "zstd level 9": zstandard.ZstdCompressor(level=9).compress,
        "blosc2 zstd clevel 5 + shuffle": lambda a: blosc2.compress2(
            a.tobytes(),
            typesize=1,
            clevel=5,
            codec=blosc2.Codec.ZSTD,
            filters=[blosc2.Filter.SHUFFLE],
        ),  # fmt: skip
        "blosc2 zstd clevel 5, no filter": lambda a: blosc2.compress2(
            a.tobytes(),
            typesize=1,
            clevel=5,
            codec=blosc2.Codec.ZSTD,
            filters=[blosc2.Filter.NOFILTER],
        ),  # fmt: skip
        "PNG level 6 (Pillow's default; reference)": lambda a: png(a, 6),
        "PNG level 1 (expstore's image codec)": lambda a: png(a, 1),
        "WebP lossless, method 0": webp,
        "expstore auto (stored bytes)": lambda a: pack_array(a, array_digest(a), "auto"),
    }
    out = []
    for name, compress in codecs.items():
        start = time.perf_counter()
        size = sum(len(compress(a if "zstd level" not in name else a.tobytes())) for a in images)
        seconds = time.perf_counter() - start
        out.append((name, size / raw, raw / seconds / 1e6))
    return out


def row(task: str, step: int, image: np.ndarray) -> DataRow:
    return DataRow(
        exp_meta=ExpMeta(task_id=task, agent_id="web", step=step),
        exp_data=Experience(state={"screenshot": image, "url": f"p{step}"}, reward_t=float(step)),
    )


def file_size(url: str) -> int:
    path = Path(url.removeprefix("sqlite:///"))
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def store_and_sample(url: str, images: list[np.ndarray], repeats: int) -> dict[str, Any]:
    """store_batch MB/s of distinct screenshots, the half-unchanged sequence's arrays, warm
    sample(16) of screenshots and of rewards (with the array bytes each read)."""
    name = f"media_{uuid.uuid4().hex[:8]}"
    result: dict[str, Any] = {}
    with ReplayBuffer(url, name=name) as buffer:
        raw = sum(a.nbytes for a in images)
        speeds = []
        for r in range(repeats):
            batch = [row(f"distinct{r}", i, img) for i, img in enumerate(images)]
            buffer.clear()
            start = time.perf_counter()
            buffer.store_batch(batch)
            speeds.append(raw / (time.perf_counter() - start) / 1e6)
        result["store MB/s"] = statistics.median(speeds)
        result["arrays"], result["pixels"], result["stored"] = buffer.array_stats()
        if url.startswith("sqlite"):
            buffer.sql.handle.connections.engine.dispose()
            result["file/raw"] = file_size(url) / raw
        # A sequence where every other step leaves the page unchanged.
        buffer.clear()
        steps = [row("half", i, images[i // 2]) for i in range(2 * len(images))]
        start = time.perf_counter()
        buffer.store_batch(steps)
        result["half store MB/s"] = (
            sum(s.exp_data.state["screenshot"].nbytes for s in steps)
            / (time.perf_counter() - start)
            / 1e6
        )
        result["half steps"] = len(steps)
        result["half arrays"] = buffer.array_stats()[0]
        unchanged = Condition.parse("unchanged(exp_data.state.screenshot)")
        result["half unchanged"] = buffer.count(unchanged)

        read: list[int] = []
        original = RowReader.rows_with_arrays

        def counted(self: RowReader, keys: Any, columns: Any, texts_at: Any) -> Any:
            fetched, found = original(self, keys, columns, texts_at)
            read.append(sum(len(v) for v in found.values()))
            return fetched, found

        RowReader.rows_with_arrays = counted  # type: ignore[method-assign]
        try:
            for label, fields in (
                ("screenshots", {"s": "exp_data.state.screenshot"}),
                ("rewards", {"r": "exp_data.reward_t"}),
            ):
                converter = NumpyConverter(fields)
                sampler = UniformSampler(seed=0)
                buffer.sample(sampler, None, converter, 16)  # warm
                times = []
                read.clear()
                for _ in range(15):
                    start = time.perf_counter()
                    buffer.sample(sampler, None, converter, 16)
                    times.append(time.perf_counter() - start)
                result[f"sample {label} ms"] = statistics.median(times) * 1000
                result[f"sample {label} bytes"] = sum(read) / len(times)
        finally:
            RowReader.rows_with_arrays = original  # type: ignore[method-assign]
        buffer.clear()
    return result


def changed_vs_indexed(url: str, steps: int, repeats: int, tracked: bool) -> dict[str, float]:
    """count() and a warm sample(16) with changed() against a plain indexed filter of about
    the same selectivity, over ``steps`` rows (trajectories of 10 steps, half unchanged);
    ``tracked``: the path tracked (``buffer.track_changes``) before the rows are stored, so
    the writes keep its flags. Also the store_batch MB/s of those rows."""
    name = f"media_changed_{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(0)
    pages = [rng.integers(0, 255, (128, 128, 4), dtype=np.uint8) for _ in range(64)]  # 64 KiB
    out: dict[str, float] = {}
    with ReplayBuffer(url, name=name) as buffer:
        if tracked:
            buffer.track_changes("exp_data.state.screenshot")
        spent = 0.0
        for start in range(0, steps, 10_000):
            batch = [
                row(f"t{i // 10}", i % 10, pages[(i // 2) % len(pages)])
                for i in range(start, min(steps, start + 10_000))
            ]
            start_t = time.perf_counter()
            buffer.store_batch(batch)
            spent += time.perf_counter() - start_t
        out["store MB/s"] = steps * pages[0].nbytes / spent / 1e6
        if url.startswith("postgresql"):
            from sqlalchemy import text

            with buffer.sql.handle.connections.engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
        changed = Condition.parse("changed(exp_data.state.screenshot)")
        plain = Comparison("step", "in", (0, 2, 4, 6, 8))  # half the rows, by the index
        for label, condition in (("changed", changed), ("indexed", plain)):
            buffer.count(condition)
            times = []
            for _ in range(repeats):
                start_t = time.perf_counter()
                found = buffer.count(condition)
                times.append(time.perf_counter() - start_t)
            out[f"{label} count ms"] = statistics.median(times) * 1000
            out[f"{label} rows"] = found
            sampler = UniformSampler(seed=1)
            buffer.sample(sampler, condition, None, 16)
            times = []
            for _ in range(repeats * 5):
                start_t = time.perf_counter()
                buffer.sample(sampler, condition, NumpyConverter({"r": "exp_data.reward_t"}), 16)
                times.append(time.perf_counter() - start_t)
            out[f"{label} sample ms"] = statistics.median(times) * 1000
        buffer.clear()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--screens", default="/work/scratch/screens")
    parser.add_argument("--pages", type=int, default=40)
    parser.add_argument(
        "--pg",
        default=os.environ.get("EXPSTORE_TEST_PG_URL"),
        help="a Postgres server URL: the benchmark makes a database of its own there",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument(
        "--only-changed",
        action="store_true",
        help="run only changed() against an indexed filter, tracked and not (no screenshots)",
    )
    args = parser.parse_args()
    images: list[np.ndarray] = []
    if not args.only_changed:
        images = _screenshots(args)
    backends = {"SQLite": None}
    if args.pg:
        backends["Postgres"] = args.pg
    for label, given in backends.items():
        folder, drop = None, None
        if given is None:
            folder = tempfile.mkdtemp(prefix="bench_media_")
            url = f"sqlite:///{folder}/media.db"
        else:
            url, drop = fresh_pg_database(given)
        try:
            if not args.only_changed:
                report(label, url, images, args)
            report_changed(label, url, args)
        finally:
            if folder is not None:
                shutil.rmtree(folder)
            if drop is not None:
                drop()


def _screenshots(args: Any) -> list[np.ndarray]:
    """The screenshots, and each codec's ratio printed."""
    images = load(render(Path(args.screens), args.pages))
    raw = sum(a.nbytes for a in images)
    print(f"{len(images)} screenshots of 720x1280x3, {raw / 1e6:.1f} MB raw")
    print("\n| codec | stored / raw | MB/s |\n|---|---|---|")
    for name, ratio, speed in ratios(images):
        print(f"| {name} | {ratio:.1%} | {speed:.0f} |")
    return images


def report(label: str, url: str, images: list[np.ndarray], args: Any) -> None:
    """Print one backend's figures."""
    measured = store_and_sample(url, images, args.repeats)
    print(f"\n{label}:")
    for key, value in measured.items():
        print(f"  {key}: {value:.4g}" if isinstance(value, float) else f"  {key}: {value}")


def report_changed(label: str, url: str, args: Any) -> None:
    """Print one backend's changed() figures, the path tracked and not."""
    for tracked in (False, True):
        counted = changed_vs_indexed(url, args.steps, args.repeats, tracked)
        print(f"\n{label}, changed() {'tracked' if tracked else 'not tracked'}:")
        for key, value in counted.items():
            print(f"  {key}: {value:.4g}")
        count_ratio = counted["changed count ms"] / counted["indexed count ms"]
        sample_ratio = counted["changed sample ms"] / counted["indexed sample ms"]
        print(f"  changed()/indexed: count {count_ratio:.2f}x, warm sample(16) {sample_ratio:.2f}x")


if __name__ == "__main__":
    main()
