"""The package root is the public API: __all__ and the module's members agree."""

from __future__ import annotations

import inspect
import sys

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
