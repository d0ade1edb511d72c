"""export_images: image arrays as PNG files to look at, named from the row id and the path
with no way out of the directory, all written or none (expstore.io)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from expstore import (
    DataRow,
    Experience,
    ExpMeta,
    InvalidArgumentError,
    MissingDependencyError,
    ReplayBuffer,
    export_images,
)
from expstore.model.images import from_png

RNG = np.random.default_rng(11)


def _row(row_id: str | None, step: int, **state: object) -> DataRow:
    meta = ExpMeta(task_id="t", agent_id="a", step=step)
    data = Experience(state=dict(state))
    return (
        DataRow(exp_meta=meta, exp_data=data)
        if row_id is None
        else DataRow(id=row_id, exp_meta=meta, exp_data=data)
    )


def _shot(*shape: int) -> np.ndarray:
    return RNG.integers(0, 256, shape, dtype=np.uint8)


def _files(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())


def test_every_image_becomes_a_png_named_by_path_and_row_id(
    buffer: ReplayBuffer, tmp_path: Path
) -> None:
    shots = {f"r{i}": _shot(24, 40, 3) for i in range(3)}
    rows = [_row(i, n, screenshot=s, url="u") for n, (i, s) in enumerate(shots.items())]
    rows.append(_row("r3", 3, screenshot=None, thumb=_shot(16, 16)))
    buffer.store_batch(rows)
    seen: list[int] = []
    out = tmp_path / "shots"
    assert export_images(buffer, out, progress=seen.append) == 4
    assert sum(seen) == 4  # one step per row read
    assert _files(out) == [
        Path("state.screenshot/r0.png"),
        Path("state.screenshot/r1.png"),
        Path("state.screenshot/r2.png"),
        Path("state.thumb/r3.png"),
    ]
    for row_id, shot in shots.items():
        np.testing.assert_array_equal(
            from_png((out / f"state.screenshot/{row_id}.png").read_bytes()), shot
        )


def test_row_ids_cannot_name_a_file_outside_the_directory(tmp_path: Path) -> None:
    hostile = ["../../escape", "/etc/passwd", "a/b", "..", ".hidden", "a\\b", "ok", "OK", "x" * 250]
    with ReplayBuffer() as buffer:
        buffer.store_batch([_row(i, n, shot=_shot(16, 16, 3)) for n, i in enumerate(hostile)])
        out = tmp_path / "out" / "shots"
        assert export_images(buffer, out) == len(hostile)
    files = _files(tmp_path)
    assert len(files) == len(hostile)
    folder = Path("out/shots/state.shot")
    assert all(f.parent == folder for f in files), files
    names = [f.name for f in files]
    assert len({n.casefold() for n in names}) == len(hostile)  # distinct, whatever the case
    assert all(not n.startswith(".") and len(n) <= 104 for n in names)
    assert "ok.png" in names
    assert any(n.startswith("_etc_passwd-") for n in names)


def test_a_named_path_without_an_image_writes_nothing(buffer: ReplayBuffer, tmp_path: Path) -> None:
    buffer.store_batch(
        [_row("r0", 0, shot=_shot(16, 16, 3)), _row("r1", 1, shot=np.zeros((16, 16), np.int32))]
    )
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    for target in (kept, tmp_path / "new"):
        with pytest.raises(
            InvalidArgumentError, match=r"row r1: exp_data\.state\.shot is not an image"
        ):
            export_images(buffer, target, images=["exp_data.state.shot"])
    assert _files(kept) == [Path("notes.txt")]  # what was there stays, nothing was added
    assert not (tmp_path / "new").exists()
    assert len(buffer) == 2


def test_a_file_of_the_same_name_is_replaced(tmp_path: Path) -> None:
    with ReplayBuffer() as buffer:
        shot = _shot(16, 16, 3)
        buffer.store(_row("r0", 0, shot=shot))
        (tmp_path / "state.shot").mkdir()
        (tmp_path / "state.shot" / "r0.png").write_bytes(b"old")
        assert export_images(buffer, tmp_path, images="state.shot") == 1
    np.testing.assert_array_equal(from_png((tmp_path / "state.shot/r0.png").read_bytes()), shot)


def test_bad_targets_and_selections_are_refused(tmp_path: Path) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("x")
    with ReplayBuffer() as buffer:
        with pytest.raises(InvalidArgumentError, match="is a file; give a directory"):
            export_images(buffer, taken)
        with pytest.raises(InvalidArgumentError, match="images must be 'auto' or field paths"):
            export_images(buffer, tmp_path / "x", images=None)
        with pytest.raises(InvalidArgumentError, match="does not name a value inside"):
            export_images(buffer, tmp_path / "x", images=["reward_t"])
    assert _files(tmp_path) == [Path("a-file")]


def test_without_pillow_the_error_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ReplayBuffer() as buffer:
        buffer.store(_row("r0", 0, shot=_shot(16, 16, 3)))
        monkeypatch.setitem(sys.modules, "PIL.Image", None)  # as if Pillow were missing
        with pytest.raises(MissingDependencyError, match=r"pip install 'expstore\[images\]'"):
            export_images(buffer, tmp_path / "shots")
    assert not (tmp_path / "shots").exists()


def test_a_file_where_a_folder_goes_is_refused_before_any_image_moves(tmp_path: Path) -> None:
    with ReplayBuffer() as buffer:
        buffer.store_batch([_row("r0", 0, a=_shot(16, 16, 3)), _row("r1", 1, b=_shot(16, 16))])
        (tmp_path / "state.b").write_text("in the way")
        with pytest.raises(InvalidArgumentError, match=r"state\.b' is a file, where the images"):
            export_images(buffer, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.b"]  # no folder made either
