"""A user's code is checked through the package's types (``mypy --strict``; the package
itself passes it, checked by CI): a batch's type follows its converter, fixed option sets
are Literal types."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: One mypy cache for the runs of this module (the package is checked once).
CACHE = Path(tempfile.gettempdir()) / "expstore-typing-test-cache"

USER_CODE = """
from typing import Any, assert_type

from expstore import (
    DataRow, DefaultConverter, ImageConverter, NumpyConverter, ReplayBuffer, StoreReport,
    TensorConverter,
)

buffer = ReplayBuffer(eviction="fifo")
assert_type(buffer.store_batch([]), int)
assert_type(buffer.store_batch([], report=True), StoreReport)
assert_type(buffer.extend({}, report=True), StoreReport)
assert_type(buffer.sample(), list[DataRow])
assert_type(buffer.sample(batch_size=4), list[DataRow])
assert_type(buffer.sample(converter=DefaultConverter()), list[DataRow])
assert_type(buffer.sample(None, None, NumpyConverter({"r": "exp_data.reward_t"})), dict[str, Any])
assert_type(buffer.sample(converter=TensorConverter({"r": "exp_data.reward_t"})), dict[str, Any])
assert_type(buffer.sample(converter=ImageConverter("state.shot", output="pil")), dict[str, Any])
"""

WRONG_CODE = """
from expstore import DataRow, ImageConverter, ReplayBuffer, TensorConverter

buffer = ReplayBuffer(eviction="lifo")
rows: list[DataRow] = buffer.sample(converter=TensorConverter({"r": "exp_data.reward_t"}))
buffer.store_batch([], dedup="maybe")
ImageConverter("state.shot", output="chw")
"""


def _mypy(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "user.py"
    path.write_text(code)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(CACHE), str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )


def test_a_batch_is_typed_by_its_converter(tmp_path: Path) -> None:
    done = _mypy(tmp_path, USER_CODE)
    assert done.returncode == 0, done.stdout[-3000:]


def test_mypy_catches_a_wrong_batch_type_and_unknown_options(tmp_path: Path) -> None:
    done = _mypy(tmp_path, WRONG_CODE)
    assert done.returncode == 1
    out = done.stdout
    assert 'Argument "eviction" to "ReplayBuffer" has incompatible type' in out
    assert 'Argument "output" to "ImageConverter" has incompatible type' in out
    # the batch of a TensorConverter is no list of rows (mypy says so by the argument)
    assert 'expected "Converter[list[DataRow]]"' in out or "Incompatible types in assignment" in out
    # store_batch is overloaded on report=: mypy names the call, or the argument
    assert 'Argument "dedup" to "store_batch"' in out or (
        'No overload variant of "store_batch"' in out and "dedup: Literal['skip', 'error']" in out
    ), out
