"""``expstore export`` and ``expstore import``: rows to and from JSON Lines or Parquet, and
episodes to and from Minari datasets."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from ..io import count_records, detect_format, export_images, export_rows, import_rows
from ..lineage_io import export_lineage
from ..minari_io import export_minari, import_minari
from ..model.images import AUTO, AUTO_MIN_SIDE, ImageSelection, require_pillow
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
    minari = "minari"


FormatOption = Annotated[
    Format | None,
    typer.Option(
        "--format",
        "-f",
        help="File format (default: from the file name's suffix); minari: OUT / IN is a "
        "Minari dataset id, episodes are tasks.",
    ),
]
MinariRootOption = Annotated[
    Path | None,
    typer.Option(
        "--minari-root",
        metavar="DIR",
        help="With --format minari: Minari's datasets directory (default: "
        "MINARI_DATASETS_PATH, else ~/.minari/datasets).",
    ),
]


def _size(path: Path) -> str:
    size = float(path.stat().st_size)
    for unit in ("bytes", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


def export(
    out: Annotated[
        str | None,
        typer.Argument(
            metavar="OUT",
            help="The file to write; - for stdout. May be left out with --images.",
        ),
    ] = None,
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
    images: Annotated[
        Path | None,
        typer.Option(
            "--images",
            metavar="DIR",
            help="Also write each image array as a PNG file, DIR/<path>/<row id>.png, for a "
            "quick look (needs Pillow: pip install 'expstore[images]').",
        ),
    ] = None,
    image_columns: Annotated[
        bool,
        typer.Option(
            "--image-columns",
            help="Parquet: write image arrays as Hugging Face Image columns "
            "image.<path> (PNG bytes), which datasets shows as images.",
        ),
    ] = False,
    image_path: Annotated[
        list[str] | None,
        typer.Option(
            "--image-path",
            metavar="PATH",
            help="Where the images are, for --images and --image-columns (repeatable; "
            "default: every uint8 HxW, HxWx3 or HxWx4 array at least "
            f"{AUTO_MIN_SIDE} pixels a side).",
        ),
    ] = None,
    minari_root: MinariRootOption = None,
    overwrite: Annotated[
        bool,
        typer.Option("--overwrite", help="With --format minari: replace a dataset of that id."),
    ] = False,
) -> None:
    """Write a buffer's rows (all, or those matching --where) to a JSON Lines or Parquet file.

    Every column and every tensor is kept, so `expstore import` gives back equal rows.
    Parquet files (pip install 'expstore[parquet]') open in pandas, polars and Hugging
    Face datasets: metadata columns, `data` (JSON text) and `tensors` (the tensor bytes).
    With --image-columns, image arrays also become Hugging Face Image columns; with
    --images DIR, PNG files to look at. With --format minari, OUT is a Minari dataset id
    and the tasks are written as its episodes (pip install 'expstore[minari]'), which
    minari.load_dataset opens.

    \b
    Example:
      expstore export --where "exp_data.ext_info.success = true" good.parquet
      expstore export --format jsonl - | head -1
      expstore export --lineage lineage.parquet
      expstore export --image-columns screens.parquet
      expstore export --images shots/ --where "task_id = 't1'"
      expstore export --format minari cartpole/expstore-v0
    """
    if format is Format.minari:
        _export_minari(out, db, buffer, where, minari_root, overwrite)
        return
    selection = _images_asked(out, format, lineage, images, image_columns, image_path)
    condition = where_condition(where)
    buf = open_buffer(db, buffer)
    written = 0
    fmt = ""
    try:
        total = buf.count(condition)
        if not total:
            warn_unknown_paths(buf, condition)
        if out is not None:
            fmt = detect_format(out, format.value if format else None)
            with progress(total, f"exporting to {out}") as advance:
                if lineage:
                    written = export_lineage(buf, out, fmt, condition, progress=advance)
                else:
                    written = export_rows(
                        buf,
                        out,
                        fmt,
                        condition,
                        progress=advance,
                        images=selection if image_columns else None,
                    )
        pictures = None
        if images is not None:
            with progress(total, f"writing images to {images}") as advance:
                pictures = export_images(buf, images, condition, images=selection, progress=advance)
    finally:
        buf.close()
    where_text = f" where {condition}" if condition is not None else ""
    if out is not None:
        size = "" if out == "-" else f", {_size(Path(out))}"
        what = "lineage records" if lineage else "rows"
        echo_err(
            f"Exported {written} {what} of buffer {buffer!r}{where_text} to {out} ({fmt}{size})"
        )
    if pictures is not None:
        echo_err(f"Wrote {pictures} images (PNG) of {total} rows{where_text} to {images}")
        if not pictures and total:
            echo_err(
                "No image arrays were found: an image is a uint8 HxW, HxWx3 or HxWx4 array "
                f"(found by itself when at least {AUTO_MIN_SIDE} pixels a side); name where "
                "they are with --image-path exp_data.state.<name>"
            )


def _export_minari(
    out: str | None,
    db: str,
    buffer: str,
    where: str | None,
    root: Path | None,
    overwrite: bool,
) -> None:
    """``expstore export --format minari DATASET_ID``."""
    if not out or out == "-":
        raise CliError("give the Minari dataset id to write (OUT), e.g. cartpole/expstore-v0")
    condition = where_condition(where)
    buf = open_buffer(db, buffer)
    try:
        total = buf.count(condition)
        with progress(total, f"exporting to Minari dataset {out}") as advance:
            dataset = export_minari(
                buf, out, condition, root=root, overwrite=overwrite, progress=advance
            )
    finally:
        buf.close()
    echo_err(
        f"Exported {dataset.total_steps} steps in {dataset.total_episodes} episodes of buffer "
        f"{buffer!r} to the Minari dataset {out!r}"
    )


def _images_asked(
    out: str | None,
    format: Format | None,
    lineage: bool,
    images: Path | None,
    image_columns: bool,
    image_path: list[str] | None,
) -> str | list[str]:
    """The image selection the options ask for (checked before anything is read or
    written), as export_rows and export_images take it."""
    if out is None and images is None:
        raise CliError("give the file to write (OUT), or --images DIR to write only images")
    if image_path and images is None and not image_columns:
        raise CliError("--image-path says where the images are for --images or --image-columns")
    if image_columns:
        if out is None or detect_format(out, format.value if format else None) != "parquet":
            raise CliError(
                "--image-columns writes Hugging Face Image columns into a Parquet file: "
                "give a *.parquet OUT (or --format parquet)"
            )
        if lineage:
            raise CliError("--image-columns applies to rows, not to --lineage records")
    selection: str | list[str] = list(image_path) if image_path else AUTO
    if images is not None or image_columns:
        ImageSelection.parse(selection)  # a bad path is refused before anything is written
        require_pillow("writing images (--images, --image-columns)")
    return selection


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
    minari_root: MinariRootOption = None,
) -> None:
    """Store the rows of an exported file (JSON Lines or Parquet) into a buffer.

    The database, its tables and the buffer are created if they do not exist. Rows are
    validated as they are read and stored 1000 per transaction.

    With --format minari, IN is a Minari dataset id: each episode becomes a task, each
    step a row (observation, action, reward, termination, truncation, infos, the final
    observation as the last row's next_state).

    \b
    Example:
      expstore import --db postgresql+psycopg://me@db.internal/exp --buffer web good.parquet
      expstore import --format minari D4RL/door/human-v2
    """
    if format is Format.minari:
        buf = open_buffer(db, buffer, create=True)
        try:
            with progress(None, f"importing Minari dataset {source}") as advance:
                stored = import_minari(buf, source, root=minari_root, progress=advance)
            size, url = buf.count(), show_url(buf.storage.url)
        finally:
            buf.close()
        echo_err(
            f"Imported {stored} steps of Minari dataset {source!r} into buffer {buffer!r} "
            f"of {url}; it now holds {size}"
        )
        return
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
