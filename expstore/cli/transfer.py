"""``expstore export`` and ``expstore import``: rows to and from JSON Lines or Parquet."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from ..io import count_records, detect_format, export_rows, import_rows
from ..lineage_io import export_lineage
from ._common import (
    DEFAULT_URL,
    BufferOption,
    CliError,
    DbOption,
    WhereOption,
    echo_err,
    open_buffer,
    progress,
    show_url,
    warn_unknown_paths,
    where_condition,
)


class Format(str, Enum):
    jsonl = "jsonl"
    parquet = "parquet"


FormatOption = Annotated[
    Format | None,
    typer.Option("--format", "-f", help="File format (default: from the file name's suffix)."),
]


def _size(path: Path) -> str:
    size = float(path.stat().st_size)
    for unit in ("bytes", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


def export(
    out: Annotated[str, typer.Argument(metavar="OUT", help="The file to write; - for stdout.")],
    db: DbOption = DEFAULT_URL,
    buffer: BufferOption = "default",
    format: FormatOption = None,
    where: WhereOption = None,
    lineage: Annotated[
        bool,
        typer.Option(
            "--lineage",
            help="Write each row's consumption record (claims: consumer, claimed and "
            "acked times, checkpoint, times claimed and sampled) instead of the row.",
        ),
    ] = False,
) -> None:
    """Write a buffer's rows (all, or those matching --where) to a JSON Lines or Parquet file.

    Every column and every tensor is kept, so `expstore import` gives back equal rows.
    Parquet files (pip install 'expstore[parquet]') open in pandas, polars and Hugging
    Face datasets: metadata columns, `data` (JSON text) and `tensors` (the tensor bytes).

    \b
    Example:
      expstore export --where "exp_data.ext_info.success = true" good.parquet
      expstore export --format jsonl - | head -1
      expstore export --lineage lineage.parquet
    """
    fmt = detect_format(out, format.value if format else None)
    condition = where_condition(where)
    buf = open_buffer(db, buffer)
    try:
        total = buf.count(condition)
        if not total:
            warn_unknown_paths(buf, condition)
        with progress(total, f"exporting to {out}") as advance:
            write = export_lineage if lineage else export_rows
            written = write(buf, out, fmt, condition, progress=advance)
    finally:
        buf.close()
    where_text = f" where {condition}" if condition is not None else ""
    size = "" if out == "-" else f", {_size(Path(out))}"
    what = "lineage records" if lineage else "rows"
    echo_err(f"Exported {written} {what} of buffer {buffer!r}{where_text} to {out} ({fmt}{size})")


def import_(
    source: Annotated[
        str, typer.Argument(metavar="IN", help="A file written by expstore export; - for stdin.")
    ],
    db: DbOption = DEFAULT_URL,
    buffer: BufferOption = "default",
    format: FormatOption = None,
    skip_existing: Annotated[
        bool,
        typer.Option("--skip-existing", help="Leave out rows whose id the buffer already holds."),
    ] = False,
) -> None:
    """Store the rows of an exported file (JSON Lines or Parquet) into a buffer.

    The database, its tables and the buffer are created if they do not exist. Rows are
    validated as they are read and stored 1000 per transaction.

    \b
    Example:
      expstore import --db postgresql+psycopg://me@db.internal/exp --buffer web good.parquet
    """
    fmt = detect_format(source, format.value if format else None)
    if source != "-" and not Path(source).is_file():
        raise CliError(f"no such file: {source}")
    total = count_records(source, fmt)
    buf = open_buffer(db, buffer, create=True)
    try:
        with progress(total, f"importing {source}") as advance:
            stored = import_rows(buf, source, fmt, skip_existing=skip_existing, progress=advance)
        size = buf.count()
        url = show_url(buf.storage.url)
    finally:
        buf.close()
    skipped = "" if total is None or stored == total else f" ({total - stored} already there)"
    echo_err(
        f"Imported {stored} rows{skipped} into buffer {buffer!r} of {url}; it now holds {size}"
    )
