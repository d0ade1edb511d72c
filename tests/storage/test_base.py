"""The interfaces are real ABCs: an incomplete implementation fails when it is made, and the
Storage interface declares everything the buffer, samplers, CLI and datasets call."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import expstore
from expstore import Converter, KeySampler, Sampler, SqlStorage, Storage, TaskSampler
from expstore.samplers import KeySpace
from expstore.storage.base import Storage as StorageInterface
from expstore.storage.key_space import SqlKeySpace


@pytest.mark.parametrize(
    "interface", [Storage, KeySpace, Sampler, KeySampler, TaskSampler, Converter]
)
def test_an_incomplete_implementation_cannot_be_made(interface: type) -> None:
    incomplete = type(f"Half{interface.__name__}", (interface,), {})
    with pytest.raises(TypeError, match="abstract"):
        incomplete()


def test_sql_storage_implements_every_storage_method() -> None:
    assert not getattr(SqlStorage, "__abstractmethods__", None)
    assert not getattr(SqlKeySpace, "__abstractmethods__", None)


def test_the_interfaces_import_no_implementation() -> None:
    """storage/base.py declares what a backend must do; it imports none of the modules
    that implement it (nor anything above the storage layer), even for type hints."""
    assert StorageInterface is Storage
    source = Path(expstore.__file__).parent / "storage" / "base.py"
    imported = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            imported.add("." * node.level + (node.module or ""))
    assert not {m for m in imported if m.startswith(".") and not m.startswith("..")}, imported
    assert all(
        m.split(".")[2]
        in {
            "_args",
            "errors",
            "model",
            "query",
            # the features it names in its types and arguments
            "arrays",
            "dedup",
            "group_summaries",
            "lifecycle",
            "limits",  # a reservation of samples (reserve_samples)
            "policy_versions",
            "retention",
        }
        for m in imported
        if m.startswith("..")
    ), imported


def test_no_storage_method_is_a_stub() -> None:
    """No method of the interface raises "use SqlStorage": what a backend must do is
    abstract, what only SQL keeps is SqlStorage's own."""
    source = inspect.getsource(Storage)
    assert "SqlStorage" not in source.split('"""', 2)[2]
    assert "raise UnsupportedTypeError" not in source


def test_nothing_probes_a_storage_for_methods_it_may_lack() -> None:
    """Every method called on a storage is declared by Storage; none is looked up with
    getattr/hasattr."""
    package = Path(expstore.__file__).parent
    declared = {name for name, _ in inspect.getmembers(Storage)} | {"name", "url"}
    called: set[str] = set()
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id in ("getattr", "hasattr") and node.args:
                    target = ast.unparse(node.args[0])
                    assert "storage" not in target, f"{path.name}:{node.lineno} probes {target}"
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
                if node.value.attr == "storage":
                    called.add(node.attr)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id == "storage":
                    called.add(node.attr)
    assert called and called <= declared, sorted(called - declared)
