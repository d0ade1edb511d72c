"""The package root is the public API: __all__ and the module's members agree."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import expstore


def test_all_is_sorted_and_every_name_resolves() -> None:
    assert expstore.__all__ == sorted(expstore.__all__)
    for name in expstore.__all__:
        assert getattr(expstore, name) is not None


def test_every_public_member_is_in_all() -> None:
    public = {n for n in dir(expstore) if not n.startswith("_")}
    modules = {n for n in public if inspect.ismodule(getattr(expstore, n))}
    assert public - modules == set(expstore.__all__) - {"__version__"}


def test_torch_names_load_lazily() -> None:
    assert expstore.SampledBatches.__name__ == "SampledBatches"
    assert "expstore.torch_data" in sys.modules


def test_star_import_works_without_torch() -> None:
    """Issue 32: ``from expstore import *`` raised MissingDependencyError without torch,
    the torch datasets being in __all__. Without torch they stand for classes whose use
    raises that error, naming the extra to install."""
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # as if torch were not installed\n"
        "from expstore import *\n"
        "assert ReplayBuffer and ExperienceDataset.__name__ == 'ExperienceDataset'\n"
        "try:\n"
        "    SampledBatches(None)\n"
        "except MissingDependencyError as exc:\n"
        "    assert \"pip install 'expstore[torch]'\" in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('no error')\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=Path(expstore.__file__).parent.parent,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
