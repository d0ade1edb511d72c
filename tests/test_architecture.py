"""The architecture map (docs/architecture.md) matches the package: every package and
module it names exists, every package and public top-level module is named, and it lists them in the
order of the layers contract (pyproject.toml), top to bottom."""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "expstore"


def _map() -> list[str]:
    """The names the architecture map gives, in order ('cli', 'buffer', ...)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("```text\n", 1)[1].split("```", 1)[0]
    names = []
    for line in block.splitlines():
        for found in re.finditer(r"(?:^  |;  )([a-z_]+)(/|\.py)", line):
            names.append(found.group(1))
    return names


def _layers() -> list[set[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c.get("containers") == ["expstore"]]
    return [{part.strip() for part in re.split(r"[|:]", layer)} for layer in contract["layers"]]


def test_every_name_in_the_map_exists() -> None:
    names = _map()
    assert len(names) > 15
    for name in names:
        assert (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file(), name


def test_every_package_and_module_is_in_the_map() -> None:
    present = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    present |= {p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}
    unnamed = present - set(_map()) - {"_optional", "_version"}
    assert not unnamed, f"packages or modules missing from the map: {sorted(unnamed)}"


def test_the_map_lists_the_layers_top_to_bottom() -> None:
    layers = _layers()
    where = {name: i for i, layer in enumerate(layers) for name in layer}
    order = [where[name] for name in _map()]
    assert order == sorted(order), list(zip(_map(), order, strict=True))
