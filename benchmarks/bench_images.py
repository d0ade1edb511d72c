"""Benchmark: images out (issue 34, part 4) on real screenshots.

Renders pages of the Python documentation Debian ships (``python3-doc``/``python3-dev``:
``/usr/share/doc/python3*/html``) at 1280x720 with headless Chromium, stores ``--rows``
steps cycling through them (``exp_data.state.screenshot``, uint8 720x1280x3) and times:

- the Parquet export with ``images="auto"`` (Hugging Face Image columns, PNG bytes) against
  the same export without (the screenshot as a ``tensor.<path>`` fixed-size-list column):
  time per row and file size over the raw pixels;
- reading the images back with ``datasets`` (``Dataset.from_parquet``, then every image
  decoded), against decoding the same PNG bytes with Pillow alone;
- ``export_images`` (PNG files): time per file;
- ``sample(16)`` with ``ImageConverter`` (``chw_float``, ``hwc_uint8``) against
  ``NumpyConverter`` of the same field (the stacked uint8 array: the floor, since every
  image converter starts from it);
- PNG at zlib level 1 and 6 (Pillow's default, what ``datasets`` writes) on the same images.

Usage::

    python benchmarks/bench_images.py                        # SQLite, 64 rows, 8 pages
    python benchmarks/bench_images.py --pg-url postgresql+psycopg://postgres@127.0.0.1/postgres

Postgres gets a database of its own (``expstore_bench_images``), dropped at the end.
"""

from __future__ import annotations

import argparse
import glob
import io
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from expstore import (
    DataRow,
    Experience,
    ExpMeta,
    ImageConverter,
    NumpyConverter,
    ReplayBuffer,
    UniformSampler,
    export_images,
    export_rows,
)
from expstore.model.images import png_bytes

PAGES = [
    "library/json",
    "library/os",
    "library/functions",
    "tutorial/introduction",
    "library/stdtypes",
    "reference/datamodel",
    "library/re",
    "whatsnew/3.11",
    "library/asyncio",
    "library/pathlib",
    "library/itertools",
    "glossary",
]


def render(count: int, out: Path) -> list[np.ndarray]:
    """``count`` screenshots of documentation pages at 1280x720, as uint8 arrays."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    roots = sorted(glob.glob("/usr/share/doc/python3*/html"))
    if chromium is None or not roots:
        raise SystemExit(
            "needs headless Chromium and the Python HTML documentation: "
            "apt-get install chromium python3-doc"
        )
    shots = []
    for page in PAGES[:count]:
        html = Path(roots[0]) / f"{page}.html"
        png = out / (page.replace("/", "_") + ".png")
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--window-size=1280,720",
                f"--screenshot={png}",
                html.as_uri(),
            ],
            capture_output=True,
            timeout=120,
            check=True,
        )
        with Image.open(png) as image:
            shots.append(np.asarray(image.convert("RGB")))
    return shots


def rows(shots: list[np.ndarray], n: int) -> list[DataRow]:
    return [
        DataRow(
            exp_meta=ExpMeta(task_id=f"t{i // 10}", agent_id="a", step=i % 10),
            exp_data=Experience(
                state={"screenshot": shots[i % len(shots)], "url": f"page-{i % len(shots)}"},
                reward_t=float(i),
            ),
        )
        for i in range(n)
    ]


def timed(work: Any, repeats: int = 1) -> tuple[float, Any]:
    """The least of ``repeats`` wall times of ``work()`` (seconds), and its last result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = work()
        best = min(best, time.perf_counter() - start)
    return best, result


def run(url: str, label: str, shots: list[np.ndarray], n: int, work: Path) -> None:
    raw = n * shots[0].nbytes
    with ReplayBuffer(url, name="bench_images") as buffer:
        buffer.store_batch(rows(shots, n))
        plain_s, _ = timed(lambda: export_rows(buffer, work / "plain.parquet"))
        image_s, _ = timed(lambda: export_rows(buffer, work / "images.parquet", images="auto"))
        plain_mb = (work / "plain.parquet").stat().st_size / raw
        image_mb = (work / "images.parquet").stat().st_size / raw
        print(f"\n{label}: {n} rows of 720x1280x3 screenshots ({raw / 1e6:.0f} MB of pixels)")
        print("| what | per row | file / raw pixels |")
        print("|---|---|---|")
        print(f'| Parquet export, images="auto" | {image_s / n * 1000:.1f} ms | {image_mb:.3f} |')
        print(f"| Parquet export, no images | {plain_s / n * 1000:.1f} ms | {plain_mb:.3f} |")

        files_s, written = timed(lambda: export_images(buffer, work / "shots"))
        assert written == n
        print(f"| export_images (PNG files) | {files_s / n * 1000:.1f} ms | |")

        try:
            import datasets
        except ImportError:
            datasets = None
        if datasets is not None:
            ds = datasets.Dataset.from_parquet(
                str(work / "images.parquet"), cache_dir=str(work / "hf")
            )
            column = "image.state.screenshot"
            read_s, images = timed(lambda: [np.asarray(im) for im in ds[column]])
            assert all(np.array_equal(a, shots[i % len(shots)]) for i, a in enumerate(images))
            pngs = [png_bytes(shots[i % len(shots)]) for i in range(n)]

            def pillow() -> list[np.ndarray]:
                out = []
                for data in pngs:
                    with Image.open(io.BytesIO(data)) as im:
                        out.append(np.asarray(im))
                return out

            floor_s, _ = timed(pillow)
            print(
                f"| datasets reads the images (equal to the stored arrays) | "
                f"{read_s / n * 1000:.1f} ms | Pillow alone: {floor_s / n * 1000:.1f} ms |"
            )

        sampler = UniformSampler(seed=0)
        batch = 16
        numpy_conv = NumpyConverter({"shot": "exp_data.state.screenshot"})

        def by_hand() -> Any:
            """NumpyConverter, then torchvision's v2 ToImage + ToDtype on each image."""
            shots = buffer.sample(sampler, batch_size=batch, converter=numpy_conv)["shot"]
            return torch.stack(
                [
                    torch.from_numpy(np.atleast_3d(s))
                    .permute((2, 0, 1))
                    .contiguous()
                    .to(torch.float32)
                    .mul_(1.0 / 255)
                    for s in shots
                ]
            )

        def draw(converter: Any) -> Any:
            return lambda: buffer.sample(sampler, batch_size=batch, converter=converter)

        ways = {
            "NumpyConverter (uint8 stack)": draw(numpy_conv),
            "NumpyConverter + torchvision v2 scaling per image, by hand": by_hand,
            **{
                f"ImageConverter({output})": draw(
                    ImageConverter("exp_data.state.screenshot", output=output)
                )
                for output in ("hwc_uint8", "chw_float", "pil")
            },
        }
        best = {name: float("inf") for name in ways}
        for way in ways.values():
            way()  # warm
        for _ in range(7):  # interleaved, so that no way gets the quieter moments
            for name, way in ways.items():
                best[name] = min(best[name], timed(way)[0] * 1000)
        floor = best["NumpyConverter (uint8 stack)"]
        print(f"\nsample({batch}) of screenshots, best of 7 interleaved rounds (warm)")
        print("| converter | ms | ratio to NumpyConverter |")
        print("|---|---|---|")
        for name, ms_ in best.items():
            print(f"| {name} | {ms_:.1f} | {ms_ / floor:.2f} |")


def png_levels(shots: list[np.ndarray]) -> None:
    print("\nPNG levels on the screenshots (per image)")
    print("| zlib level | ms | bytes / raw |")
    print("|---|---|---|")
    raw = sum(s.nbytes for s in shots)
    for level in (1, 6, 9):
        seconds, sizes = timed(lambda lv=level: [len(png_bytes(s, level=lv)) for s in shots], 3)
        print(f"| {level} | {seconds / len(shots) * 1000:.1f} | {sum(sizes) / raw:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--pages", type=int, default=8)
    parser.add_argument("--pg-url", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shots = render(args.pages, work)
        print(f"{len(shots)} screenshots of the Python documentation, 1280x720")
        png_levels(shots)
        (work / "sqlite").mkdir()
        run(f"sqlite:///{work / 'bench.db'}", "SQLite", shots, args.rows, work / "sqlite")
        if args.pg_url:
            server = make_url(args.pg_url)
            admin = create_engine(server, isolation_level="AUTOCOMMIT")
            name = "expstore_bench_images"
            with admin.connect() as conn:
                conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
                conn.execute(text(f"CREATE DATABASE {name}"))
            try:
                (work / "pg").mkdir()
                url = server.set(database=name).render_as_string(hide_password=False)
                run(url, "Postgres", shots, args.rows, work / "pg")
            finally:
                with admin.connect() as conn:
                    conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                admin.dispose()


if __name__ == "__main__":
    main()
