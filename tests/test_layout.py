"""tests/ mirrors expstore/, so the tests of a module are found by its path: the tests of
expstore/storage/key_space.py are in tests/storage/ (test_key_space.py), those of
expstore/claims/api.py in tests/claims/ (test_api.py).

A test module's folder is a package folder of expstore (tests/x/y/ for expstore/x/y/); a
test module at the top of tests/ is named after a top-level module (test_<module>.py or
test_<module>_<what>.py). The suites about no one module are named below; nothing else
may sit outside the mirror."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "expstore"

#: Suites about the whole package rather than one module (paths under tests/; a folder
#: ends with "/").
CROSS_CUTTING = {
    "multihost/",  # many hosts on a Postgres cluster in network namespaces
    "test_architecture.py",  # docs/architecture.md's map against the package
    "test_aworld_compat.py",  # AWorld's README example, with only the imports changed
    "test_aworld_package.py",  # AWorld's own replay-buffer code on expstore's storage
    "test_bad_input.py",  # bad input at every public entry point
    "test_docs_blocks.py",  # the Python blocks of docs/ and README.md
    "test_docs_site.py",  # the documentation site (mkdocs build --strict, its search)
    "test_examples.py",  # examples/
    "test_exports.py",  # the package root's public members
    "test_layout.py",  # this file: tests/ itself
    "test_packaging.py",  # the wheel
    "test_typing.py",  # users' code under mypy --strict
}


def _test_modules() -> list[Path]:
    return sorted(p.relative_to(TESTS) for p in TESTS.rglob("test_*.py"))


def _cross_cutting(path: Path) -> bool:
    return path.as_posix() in CROSS_CUTTING or any(
        path.as_posix().startswith(entry) for entry in CROSS_CUTTING if entry.endswith("/")
    )


def test_every_test_folder_mirrors_a_package_folder() -> None:
    stray = [
        str(path)
        for path in _test_modules()
        if not _cross_cutting(path) and not (PACKAGE / path.parent / "__init__.py").is_file()
    ]
    assert stray == [], f"test modules in folders expstore/ does not have: {stray}"


def test_every_test_module_at_the_top_is_named_after_a_top_level_module() -> None:
    modules = {p.stem.lstrip("_") for p in PACKAGE.glob("*.py") if not p.stem.startswith("__")}
    stray = [
        str(path)
        for path in _test_modules()
        if path.parent == Path(".")
        and not _cross_cutting(path)
        and not any(
            path.stem == f"test_{module}" or path.stem.startswith(f"test_{module}_")
            for module in modules
        )
    ]
    assert stray == [], f"test modules at the top named after no module of expstore/: {stray}"


def test_every_test_folder_is_a_package() -> None:
    """(tests/ itself is a namespace package; its folders must be packages, or two test
    modules of one name, such as samplers/test_base.py and storage/test_base.py, clash.)"""
    folders = {path.parent for path in _test_modules()} - {Path(".")}
    missing = sorted(str(f) for f in folders if not (TESTS / f / "__init__.py").is_file())
    assert missing == [], f"test folders without __init__.py: {missing}"


def test_every_cross_cutting_suite_named_exists() -> None:
    assert [entry for entry in sorted(CROSS_CUTTING) if not (TESTS / entry).exists()] == []
