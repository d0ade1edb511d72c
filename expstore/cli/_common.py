"""What every command shares: the options, opening a database, errors, output helpers.

Errors: any exception a command raises is turned into one line on stderr (``Error: ...``)
and exit status 1 by :class:`ExpstoreGroup`; a ``--where`` mistake adds the text and a
caret under the column. ``EXPSTORE_DEBUG=1`` re-raises instead, for a traceback. Passwords
of database URLs are replaced with ``***`` in everything printed.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, quote_plus

import numpy as np
import typer
from pydantic import ValidationError
from rich.cells import cell_len, set_cell_size
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from typer.core import TyperGroup

from .._optional import loaded_torch
from ..buffer import ReplayBuffer
from ..db import migrate
from ..errors import ExpstoreError, QueryError, SchemaVersionError, StorageError
from ..lifecycle.registry import BufferInfo
from ..model.images import describe_image, looks_like_image
from ..model.layout import META_COLUMNS, PAYLOAD_FIELDS, SCALAR_COLUMNS
from ..model.rows import DataRow
from ..query import Condition
from ..query.conditions import And, Changed, Comparison, Or
from ..storage import describe_database

DEFAULT_URL = "sqlite:///expstore.db"
URL_ENV = "EXPSTORE_URL"
DEBUG_ENV = "EXPSTORE_DEBUG"

# -- shared options -----------------------------------------------------------------------

DbOption = Annotated[
    str,
    typer.Option(
        "--db",
        envvar=URL_ENV,
        show_envvar=True,
        metavar="URL",
        help=(
            "Database URL: sqlite:///path.db (or just the file path) or "
            "postgresql+psycopg://user@host:5432/db."
        ),
    ),
]
DatabaseArgument = Annotated[
    str | None,
    typer.Argument(
        metavar="DATABASE",
        show_default=False,
        help="The database, as --db takes it (a SQLite file's path, or a URL); wins over --db.",
    ),
]
BufferOption = Annotated[
    str,
    typer.Option("--buffer", "-b", metavar="NAME", help="Which buffer of the database."),
]
WhereOption = Annotated[
    str | None,
    typer.Option(
        "--where",
        "-w",
        metavar="FILTER",
        help=(
            "Only rows matching this filter, e.g. \"task_id = 't1' and step >= 3\" "
            "(= != > >= < <=, in (...), like, between, is null, and, or, parentheses)."
        ),
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
CsvOption = Annotated[
    bool,
    typer.Option(
        "--csv",
        help="Print CSV: a header, then one line per row (payload fields as JSON text).",
    ),
]


# -- errors -------------------------------------------------------------------------------

_SECRETS: set[str] = set()


def redact(text: str) -> str:
    """``text`` with every known database password replaced by ``***``.

    Inside URLs (``:password@``, plain or percent-encoded) always; elsewhere only for
    passwords long enough not to be an ordinary word.
    """
    for secret in sorted(_SECRETS, key=len, reverse=True):
        for form in {secret, quote_plus(secret), quote(secret, safe="")}:
            text = text.replace(f":{form}@", ":***@")
            if len(form) >= 6:
                text = text.replace(form, "***")
    return text


class CliError(ExpstoreError):
    """A mistake the user can fix: printed as ``Error: message`` on stderr, exit status 1.

    ``multiline`` keeps the message's line breaks (a ``--where`` caret display); other
    messages are folded onto one line.
    """

    def __init__(self, message: str, *, multiline: bool = False) -> None:
        super().__init__(message)
        self.multiline = multiline


def describe_error(exc: BaseException) -> str:
    """The message for an exception a command raised: one line, passwords hidden."""
    if isinstance(exc, CliError) and exc.multiline:
        return redact(str(exc))
    if isinstance(exc, ValidationError):
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in exc.errors()
        )
        text = f"invalid row: {problems}"
    elif isinstance(exc, (ExpstoreError, CliError)):
        text = str(exc)
    elif isinstance(exc, SQLAlchemyError):
        orig = getattr(exc, "orig", None)
        detail = str(orig if orig is not None else exc).strip().splitlines()
        text = f"database error: {detail[0] if detail else type(exc).__name__}"
    elif isinstance(exc, OSError):
        name = f": {exc.filename}" if exc.filename else ""
        text = f"{exc.strerror or exc}{name}"
    elif isinstance(exc, (ValueError, TypeError)):
        text = str(exc)
    else:
        text = (
            f"unexpected {type(exc).__name__}: {exc} "
            f"(set {DEBUG_ENV}=1 to see the traceback, and please report it)"
        )
    return redact(" ".join(text.split()))


class ExpstoreGroup(TyperGroup):
    """The command group: library errors become one-line CLI errors, never tracebacks."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort):
            raise
        except BrokenPipeError:
            # The reader went away (``expstore export ... - | head -1``): not an error. Point
            # stdout at nothing so the interpreter's last flush does not fail again.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            raise typer.Exit(0) from None
        except Exception as exc:
            # Usage errors (bad options) are the CLI library's own; it prints them.
            if isinstance(exc, _LIBRARY_ERROR) or os.environ.get(DEBUG_ENV) == "1":
                raise
            typer.echo(f"Error: {describe_error(exc)}", err=True)
            raise typer.Exit(1) from None


#: The CLI library's base for its own errors (usage errors, bad parameters), which it
#: prints itself: found through typer.BadParameter, since typer either re-exports click's
#: classes or vendors a copy of click.
_LIBRARY_ERROR: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"
)


# -- databases ----------------------------------------------------------------------------


#: File names ``--db`` takes as SQLite files without a URL (an existing file too).
_SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")


def parse_url(db: str) -> URL:
    """The URL ``--db`` names (a bare file path is a SQLite file: ``agents.db``); remembers
    its password so it is never printed."""
    if "://" not in db and (Path(db).suffix in _SQLITE_SUFFIXES or Path(db).is_file()):
        db = f"sqlite:///{Path(db).expanduser().resolve()}"
    try:
        url = make_url(db)
    except ArgumentError:
        raise CliError(
            f"--db: {db!r} is not a database URL; expected sqlite:///path.db, sqlite:// or "
            "postgresql+psycopg://user@host:5432/db"
        ) from None
    if url.password:
        _SECRETS.add(str(url.password))
    if url.get_backend_name() not in ("sqlite", "postgresql"):
        raise CliError(
            f"--db: expstore stores rows in SQLite or PostgreSQL, got a "
            f"{url.get_backend_name()!r} URL ({show_url(url)}); use sqlite:///path.db or "
            "postgresql+psycopg://user@host:5432/db"
        )
    return url


def show_url(url: URL | str) -> str:
    """A URL as it may be printed: the password hidden."""
    parsed = make_url(url) if isinstance(url, str) else url
    return parsed.render_as_string(hide_password=True)


def sqlite_path(url: URL) -> Path | None:
    """The file a SQLite URL names, or None (in-memory, or not SQLite)."""
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(str(url.database))


def check_revision(revision: str | None, shown: str, *, allow_older: bool = False) -> None:
    """Refuse a schema newer than this library (and an older one unless ``allow_older``)."""
    if revision is None or revision == migrate.head_revision():
        return
    if revision not in migrate.known_revisions():
        raise SchemaVersionError(
            f"the database {shown} has schema revision {revision!r}, newer than this expstore "
            f"(which knows up to {migrate.head_revision()!r}); nothing was changed. Upgrade "
            "expstore (pip install -U expstore) to use it"
        )
    if not allow_older:
        raise SchemaVersionError(
            f"the database {shown} has schema revision {revision!r}, older than this "
            f"expstore's {migrate.head_revision()!r}; upgrade it with "
            f"`expstore upgrade --db {shown}`"
        )


def read_database(
    url: URL, *, count_rows: bool = True
) -> tuple[str | None, list[BufferInfo] | None]:
    """:func:`expstore.storage.describe_database`, its errors told as the CLI tells them."""
    try:
        return describe_database(url, count_rows=count_rows)
    except SQLAlchemyError as exc:
        raise StorageError(f"cannot read {show_url(url)}: {describe_error(exc)}") from None


def inspect_database(url: URL) -> tuple[str, list[str]]:
    """Check that ``url`` holds an expstore schema; its revision and buffer names.

    Creates nothing: a missing SQLite file or an empty database is an error naming the
    command that creates one.
    """
    path = sqlite_path(url)
    if path is not None and not path.exists():
        raise CliError(
            f"there is no database at {path}; create one with `expstore init --db "
            f"{show_url(url)}`, or point --db (or {URL_ENV}) at an existing one"
        )
    revision, found = read_database(url, count_rows=False)
    if revision is None:
        raise CliError(
            f"{show_url(url)} has no expstore tables; create them with "
            f"`expstore init --db {show_url(url)}`"
        )
    check_revision(revision, show_url(url))
    return revision, [info.name for info in found or []]


def open_buffer(db: str, name: str, *, create: bool = False) -> ReplayBuffer:
    """The buffer ``name`` of ``db``.

    Reading commands (``create=False``) never create anything: the database must exist,
    hold the expstore schema and a buffer of that name. ``create=True`` creates what is
    missing.
    """
    url = parse_url(db)
    if not create:
        _, names = inspect_database(url)
        if name not in names:
            known = ", ".join(names) if names else "none yet"
            raise CliError(
                f"{show_url(url)} has no buffer named {name!r} (buffers: {known}); "
                "choose one with --buffer"
            )
    return ReplayBuffer(url, name=name)


def where_condition(text: str | None) -> Condition | None:
    """The Condition of a ``--where`` option (None without one)."""
    if text is None:
        return None
    try:
        return Condition.parse(text)
    except QueryError as exc:
        # Keep the caret display: the one place an error takes more than a line.
        raise CliError(f"--where: {exc}", multiline=True) from None


# -- output -------------------------------------------------------------------------------


def echo_err(message: str) -> None:
    """A status line on stderr (stdout stays clean for data)."""
    typer.echo(redact(message), err=True)


@contextmanager
def progress(total: int | None, description: str) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr when it is a terminal; a no-op when piped or captured."""
    if not sys.stderr.isatty():
        yield lambda n: None
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON: arrays and tensors as nested lists, bytes as hex,
    non-finite floats as strings."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (np.ndarray, np.generic)):
        return jsonable(value.tolist())
    torch = loaded_torch()
    if torch is not None and isinstance(value, torch.Tensor):
        return jsonable(
            value.detach().cpu().float().tolist()
            if value.dtype == torch.bfloat16
            else value.detach().cpu().tolist()
        )
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    if hasattr(value, "model_dump"):
        return jsonable(value.model_dump())
    return value


def rows_csv(rows: Sequence[DataRow]) -> str:
    """Rows as CSV: id, the typed columns, then each payload field as compact JSON text."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["id", *META_COLUMNS, *SCALAR_COLUMNS, *PAYLOAD_FIELDS])
    for row in rows:
        meta, data = row.exp_meta, row.exp_data
        writer.writerow(
            [
                row.id,
                *(getattr(meta, c) for c in META_COLUMNS),
                *(getattr(data, c) for c in SCALAR_COLUMNS),
                *(
                    json.dumps(
                        jsonable(getattr(data, f)), ensure_ascii=False, separators=(",", ":")
                    )
                    for f in PAYLOAD_FIELDS
                ),
            ]
        )
    return out.getvalue()


def row_json(row: DataRow) -> dict[str, Any]:
    """A row as plain JSON for ``--json`` output."""
    return {
        "id": row.id,
        "exp_meta": jsonable(row.exp_meta.model_dump()),
        "exp_data": {
            name: jsonable(getattr(row.exp_data, name)) for name in type(row.exp_data).model_fields
        },
    }


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def summarize(value: Any, width: int = 48) -> str:
    """A short one-line view of a value: a dict as ``key=value`` pairs, arrays and tensors
    as ``float32[4]``, image arrays (uint8 HxW, HxWx3, HxWx4, at least 16 pixels a side) as
    ``image 1280x720 RGB 3fa2c1d0`` (the size, PIL's mode and the digest's first 8 hex
    digits; a dict's images come first), a one-item list as its item; cut to ``width``
    with ``…``."""

    def shrink(v: Any) -> Any:
        if isinstance(v, dict):
            return {str(k): shrink(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [shrink(x) for x in v]
        if looks_like_image(v):
            return describe_image(v)
        if isinstance(v, np.ndarray):
            return f"{v.dtype}{list(v.shape)}"
        torch = loaded_torch()
        if torch is not None and isinstance(v, torch.Tensor):
            return f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}"
        if isinstance(v, (bytes, bytearray)):
            return f"bytes[{len(v)}]"
        return jsonable(v)

    def show(v: Any) -> str:
        return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, separators=(",", ":"))

    plain = shrink(value)
    if isinstance(plain, list) and len(plain) == 1:
        plain = plain[0]
    if isinstance(plain, dict) and isinstance(value, dict):
        # Images first: their line is short and fixed, so a long value (a URL) cannot cut it.
        first = [k for k, v in value.items() if looks_like_image(v)]
        plain = {**{str(k): plain[str(k)] for k in first}, **plain}
    if isinstance(plain, dict) and plain:
        text = " ".join(f"{k}={show(v)}" for k, v in plain.items())
    else:
        text = show(plain)
    return text if len(text) <= width else text[: width - 1] + "…"


def render_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    right: Sequence[str] = (),
    width: int | None = None,
) -> str:
    """A plain-text table; the last column is cut (with ``…``) to fit ``width``
    (default: the terminal's width, 100 when not a terminal). Widths are display cells
    (rich's ``cell_len``), so CJK text and emoji, two cells wide, stay aligned."""
    if width is None:
        width = shutil.get_terminal_size((100, 24)).columns
    widths = [max([cell_len(h)] + [cell_len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    fixed = sum(widths[:-1]) + 2 * (len(headers) - 1)
    widths[-1] = max(min(widths[-1], max(width - fixed, 10)), cell_len(headers[-1]))

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, (cell, w) in enumerate(zip(cells, widths, strict=True)):
            if cell_len(cell) > w:
                cell = set_cell_size(cell, w - 1) + "…"
            pad = " " * (w - cell_len(cell))
            out.append(pad + cell if headers[i] in right else cell + pad)
        return "  ".join(out).rstrip()

    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *map(line, rows)])


def number(value: float | None, digits: int = 3) -> str:
    """A number for a table: ``-`` for None/NaN, ints as they are, floats to ``digits``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(int(value))
    v = float(value)
    if v != 0 and (abs(v) >= 1e6 or abs(v) < 10**-digits):
        return f"{v:.{digits}g}"
    text = f"{v:.{digits}f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def warn_unknown_paths(buffer: ReplayBuffer, condition: Condition | None) -> None:
    """When a filter matched nothing: warn (on stderr) about each payload path in it that
    no row of the buffer has, most likely a typo (``exp_data.state.nosuch``)."""
    if condition is None:
        return
    paths = sorted({c.field for c in _comparisons(condition) if c.target.column is None})
    for path in paths:
        anywhere = Comparison(path, "is_not_null", None)
        if next(iter(buffer.query(anywhere, limit=1)), None) is None:
            typer.echo(
                f"Warning: no row of buffer {buffer.storage.name!r} has {path}, so the "
                "filter cannot match there; check the path (expstore query --limit 1 "
                "shows a row)",
                err=True,
            )


def _comparisons(condition: Condition) -> list[Comparison | Changed]:
    if isinstance(condition, Comparison | Changed):
        return [condition]
    assert isinstance(condition, And | Or)
    return [c for part in condition.conditions for c in _comparisons(part)]
