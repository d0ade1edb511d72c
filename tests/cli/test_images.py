"""Images on the command line: row tables show ``image WxH MODE digest`` instead of the
array, ``expstore export --images DIR`` writes PNG files and says how many, and
``--image-columns`` writes Hugging Face Image columns; bad options fail in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from expstore import ReplayBuffer
from expstore.codec import array_digest
from expstore.model.images import from_png
from tests.cli.conftest import Invoke
from tests.cli.test_commands import assert_one_line_error
from tests.helpers import make_row

RNG = np.random.default_rng(3)


@pytest.fixture
def screens(db_url: str, buffer_name: str) -> tuple[str, str, list[np.ndarray]]:
    """(url, buffer, screenshots): three 720p screenshots and a row without one."""
    shots = [RNG.integers(0, 256, (720, 1280, 3), dtype=np.uint8) for _ in range(3)]
    rows = [
        make_row("t", "a", i, state={"screenshot": s, "url": f"https://x/{i}"})
        for i, s in enumerate(shots)
    ]
    rows.append(make_row("t", "a", 3, state={"screenshot": None, "url": "https://x/3"}))
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(rows)
    return db_url, buffer_name, shots


def test_query_shows_an_image_as_its_size_mode_and_digest(
    invoke: Invoke, screens: tuple[str, str, list[np.ndarray]]
) -> None:
    url, name, shots = screens
    result = invoke("query", "--db", url, "-b", name)
    assert result.exit_code == 0, result.stderr
    for shot in shots:
        assert f"screenshot=image 1280x720 RGB {array_digest(shot)[:8]}" in result.stdout
    assert "uint8[" not in result.stdout and len(result.stdout) < 2000


def test_sample_shows_images_the_same_way(
    invoke: Invoke, screens: tuple[str, str, list[np.ndarray]]
) -> None:
    url, name, _ = screens
    result = invoke("sample", "--db", url, "-b", name, "-n", "2", "--seed", "0")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("image 1280x720 RGB ") + result.stdout.count("screenshot=null") == 2


def test_export_images_writes_pngs_and_says_how_many(
    invoke: Invoke, screens: tuple[str, str, list[np.ndarray]], tmp_path: Path
) -> None:
    url, name, shots = screens
    result = invoke("export", "--db", url, "-b", name, "--images", "shots")
    assert result.exit_code == 0, result.stderr
    assert "Wrote 3 images (PNG) of 4 rows to shots" in result.stderr
    files = sorted((tmp_path / "shots" / "state.screenshot").iterdir())
    assert len(files) == 3 and not list(tmp_path.glob("*.parquet"))
    with ReplayBuffer(url, name=name) as buffer:
        by_id = {row.id: row.exp_data.state["screenshot"] for row in buffer.query()}
    for file in files:
        np.testing.assert_array_equal(from_png(file.read_bytes()), by_id[file.stem])
    assert {array_digest(by_id[f.stem]) for f in files} == {array_digest(s) for s in shots}


def test_export_with_image_columns_and_images_at_once(
    invoke: Invoke, screens: tuple[str, str, list[np.ndarray]], tmp_path: Path
) -> None:
    datasets = pytest.importorskip("datasets")
    url, name, shots = screens
    result = invoke(
        "export",
        "--db",
        url,
        "-b",
        name,
        "-w",
        "step < 2",
        "--image-columns",
        "--image-path",
        "exp_data.state.screenshot",
        "--images",
        "shots",
        "screens.parquet",
    )
    assert result.exit_code == 0, result.stderr
    assert "Exported 2 rows" in result.stderr and "Wrote 2 images (PNG) of 2 rows" in result.stderr
    ds = datasets.Dataset.from_parquet("screens.parquet", cache_dir=str(tmp_path / "hf"))
    assert ds.features["image.state.screenshot"] == datasets.Image()
    for image, shot in zip(ds["image.state.screenshot"], shots[:2], strict=True):
        np.testing.assert_array_equal(np.asarray(image), shot)


def test_no_image_found_is_said(
    invoke: Invoke, sqlite_seeded: tuple[str, str], tmp_path: Path
) -> None:
    url, name = sqlite_seeded
    result = invoke("export", "--db", url, "-b", name, "--images", "shots")
    assert result.exit_code == 0, result.stderr
    assert "Wrote 0 images (PNG) of 40 rows" in result.stderr
    assert "No image arrays were found" in result.stderr and "--image-path" in result.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["export"], ["give the file to write (OUT)", "--images DIR"]),
        (["export", "--image-columns", "rows.jsonl"], ["--image-columns", "*.parquet"]),
        (["export", "--image-path", "state.shot", "rows.parquet"], ["--image-path says"]),
        (["export", "--images", "shots", "--image-path", "step"], ["does not name a value"]),
        (
            ["export", "--images", "shots", "--image-path", "exp_data.state.url"],
            ["exp_data.state.url is not an image", "it is a str"],
        ),
        (["export", "--lineage", "--image-columns", "l.parquet"], ["not to --lineage"]),
    ],
)
def test_bad_image_options_fail_in_one_line_and_write_nothing(
    invoke: Invoke,
    screens: tuple[str, str, list[np.ndarray]],
    tmp_path: Path,
    args: list[str],
    words: list[str],
) -> None:
    url, name, _ = screens
    before = sorted(p.name for p in tmp_path.iterdir())
    assert_one_line_error(invoke(*args, "--db", url, "-b", name), *words)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
