"""Lazy imports of optional dependencies, with errors that name the extra to install."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

from .errors import MissingDependencyError

_EXTRAS = {
    "torch": "torch",
    "psycopg": "postgres",
    "pyarrow": "parquet",
    "PIL": "images",
    "starlette": "ui",
    "jinja2": "ui",
    "uvicorn": "ui",
    "aworld": "aworld",
    "torchrl": "torchrl",
    "tensordict": "torchrl",
    "minari": "minari",
    "gymnasium": "minari",
}


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` or raise MissingDependencyError naming the pip extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        extra = _EXTRAS.get(module.split(".")[0], module)
        raise MissingDependencyError(
            f"{purpose} needs the optional dependency {module!r}, which is not installed; "
            f"install it with: pip install 'expstore[{extra}]'"
        ) from exc


def loaded_torch() -> Any | None:
    """The torch module if something already imported it, else None (never imports it)."""
    return sys.modules.get("torch")
