"""The error contract: every error expstore raises on purpose is an ExpstoreError, of the
built-in kind Python code expects, and nothing is told apart by its message text."""

from __future__ import annotations

import ast
import builtins
import inspect
from pathlib import Path

import pytest
from pydantic import ValidationError

import expstore
from expstore import errors

PACKAGE = Path(expstore.__file__).parent
BUILTIN_ERRORS = {
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
}


def _raises(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every ``raise Name(...)`` / ``raise Name``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(target, ast.Name):
                found.append((node.lineno, target.id))
    return found


def test_no_module_raises_a_builtin_exception_on_purpose() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE)}:{line} raises {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, name in _raises(ast.parse(path.read_text()))
        # AttributeError is the protocol of a module's __getattr__, StopIteration an
        # iterator's (expstore.prefetch), StopAsyncIteration an async iterator's
        # (expstore.aio's batches).
        if name in BUILTIN_ERRORS
        and name
        not in ("NotImplementedError", "AttributeError", "StopIteration", "StopAsyncIteration")
    ]
    assert not offenders, "raise an ExpstoreError subclass instead:\n" + "\n".join(offenders)


def test_no_module_matches_exception_text() -> None:
    """``"..." in str(exc)`` tells errors apart by wording, which drivers change."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Compare)
                and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
                and any(
                    isinstance(c, ast.Call)
                    and isinstance(c.func, ast.Name)
                    and c.func.id == "str"
                    and c.args
                    and isinstance(c.args[0], ast.Name)
                    and c.args[0].id in ("exc", "error", "e", "err")
                    for c in node.comparators
                )
            ):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not offenders, offenders


ERRORS = [
    value
    for value in vars(errors).values()
    if isinstance(value, type) and issubclass(value, errors.ExpstoreError)
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: e.__name__)
def test_every_error_is_exported_documented_and_drawn_in_the_tree(error: type) -> None:
    assert error.__name__ in errors.__all__ and getattr(expstore, error.__name__) is error
    assert inspect.getdoc(error)
    assert error.__name__ in (errors.__doc__ or "")


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (errors.InvalidArgumentError, ValueError),
        (errors.RetentionConflictError, ValueError),
        (errors.UnsupportedTypeError, TypeError),
        (errors.OutOfRangeError, IndexError),
        (errors.RowValidationError, ValidationError),
        (errors.CodecError, ValueError),
        (errors.QueryError, ValueError),
        (errors.EmptyBufferError, ValueError),
        (errors.DuplicateIdError, errors.StorageError),
        (errors.DuplicateIdError, ValueError),
        (errors.MissingDependencyError, ImportError),
    ],
)
def test_errors_are_the_builtin_kind_python_code_expects(error: type, kind: type) -> None:
    assert issubclass(error, kind) and issubclass(error, errors.ExpstoreError)


def test_bad_arguments_raise_expstore_errors_that_are_value_and_type_errors() -> None:
    from expstore import PrioritizedSampler, ReplayBuffer, SliceSampler

    with pytest.raises(errors.InvalidArgumentError, match="alpha must be a finite number >= 0"):
        PrioritizedSampler(alpha=-1)
    with pytest.raises(errors.InvalidArgumentError, match="slice_len must be an int >= 1"):
        SliceSampler(0)
    with pytest.raises(errors.UnsupportedTypeError, match="expects None, a database URL"):
        ReplayBuffer(storage=3)  # type: ignore[arg-type]
    with ReplayBuffer() as buffer, pytest.raises(ValueError, match="capacity must be None or"):
        buffer.set_retention(0)
