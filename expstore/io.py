"""Export rows to files and import them back: JSON Lines and Parquet.

Both formats hold one record per row with the same flat columns, so they open in ordinary
tools (``pandas.read_parquet``, ``polars.read_parquet``, Hugging Face
``datasets.load_dataset("parquet", ...)``, ``jq``)::

    id, task_id, task_name, agent_id, step, execute_time, pre_agent,   -- ExpMeta and the id
    policy_version,
    reward_t, adv_t, v_t, done,                                         -- scalar columns
    data,     -- state, actions, messages, next_state, ext_info: the codec's JSON document
    tensors   -- the codec's tensor blob (base64 text in JSONL, binary in Parquet), or null

``data`` is a JSON object in JSONL and JSON text in Parquet. Arrays and tensors appear in it
as ``{"__tensor__": {"dtype", "shape", "offset", "nbytes", ...}}`` placeholders pointing into
``tensors`` (see :mod:`expstore.codec`), so a round trip gives back equal rows, dtypes and
torch-vs-numpy included. Nothing is pickled. Parquet adds derived columns that import
ignores (see :mod:`expstore.model.arrow`): ``tensor.<path>`` per array path, and with
``images=`` Hugging Face image columns ``image.<path>`` (PNG). :func:`export_images` writes
image arrays as PNG files to look at.

Usage::

    from .io import export_rows, import_rows

    export_rows(buffer, "good.parquet", query_condition=successful)   # -> rows written
    import_rows(other_buffer, "good.parquet", skip_existing=True)     # -> rows stored

Parquet needs pyarrow (``pip install 'expstore[parquet]'``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Protocol

from pydantic import ValidationError

from ._optional import require
from ._version import __version__
from .codec import decode_payload, encode_payload
from .codec.checks import MAX_DEPTH
from .errors import CodecError, ExpstoreError, InvalidArgumentError
from .model.arrow import (
    ImageColumn,
    TensorColumn,
    hf_features,
    image_columns,
    image_fields,
    image_table,
    tensor_columns,
    tensor_fields,
    tensor_table,
)
from .model.images import ImageSelection, png_bytes, require_pillow
from .model.layout import COLUMNS as LAYOUT
from .model.layout import META_COLUMNS, PAYLOAD_FIELDS, SCALAR_COLUMNS
from .model.rows import DataRow, Experience, ExpMeta
from .query import Comparison, QueryCondition, as_condition
from .storage.base import Storage

__all__ = [
    "to_arrow",
    "COLUMNS",
    "FORMATS",
    "count_records",
    "detect_format",
    "export_images",
    "export_rows",
    "import_rows",
    "record_to_row",
    "row_to_record",
]


class Rows(Protocol):
    """What export and import use of a buffer: a :class:`~expstore.ReplayBuffer` is one."""

    @property
    def storage(self) -> Storage:
        """Where the rows live (its name goes into a Parquet file's metadata)."""

    def query(self, query_condition: QueryCondition = None) -> Iterator[DataRow]:
        """The matching rows in insertion order."""

    def store_batch(self, rows: Sequence[DataRow]) -> int:
        """Store every row, or none of them."""


#: The file formats export and import understand.
FORMATS = ("jsonl", "parquet")
#: The columns of every exported record, in order: the id, the row layout's typed columns
#: (see :mod:`expstore.model.layout`), the document and the blob.
COLUMNS = ("id", *(c.name for c in LAYOUT), "data", "tensors")
_META = META_COLUMNS
_SCALARS = SCALAR_COLUMNS
#: What a record must hold: the document, and every column that has no default or whose
#: default is made when a row is built (an id, a time), which an import must not invent.
_REQUIRED = frozenset(
    {"data"}
    | {
        name
        for name, info in {**ExpMeta.model_fields, "id": DataRow.model_fields["id"]}.items()
        if info.is_required() or info.default_factory is not None
    }
)
_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet"}
#: Rows per Parquet row group and per import transaction.
CHUNK = 1000
#: A Parquet row group (and a ``to_arrow`` chunk) also ends once its rows' arrays and bytes
#: reach this size, so that rows of screenshots (2.8 MB each at 720p) are not held 1000 at
#: a time, several times over (the rows, their blobs, their columns).
CHUNK_BYTES = 256 * 2**20

#: Called with the number of rows just written or read.
Progress = Callable[[int], None]


def detect_format(path: str | os.PathLike[str], format: str | None = None) -> str:
    """``format`` if given (checked), else the one the file name's suffix implies."""
    if format is not None:
        if format not in FORMATS:
            raise InvalidArgumentError(
                f"format must be one of {', '.join(FORMATS)}, got {format!r}"
            )
        return format
    if str(path) == "-":
        return "jsonl"
    suffix = Path(path).suffix.lower()
    if suffix in _SUFFIXES:
        return _SUFFIXES[suffix]
    raise InvalidArgumentError(
        f"cannot tell the format of {str(path)!r} from its suffix; name the file *.jsonl or "
        "*.parquet, or give the format (jsonl or parquet)"
    )


# ---------------------------------------------------------------------------------------
# Rows <-> records


def row_to_record(row: DataRow, *, binary: bool = False) -> dict[str, Any]:
    """One row as a flat record (``data`` a dict; ``tensors`` base64 text, or bytes when
    ``binary``)."""
    meta, data = row.exp_meta, row.exp_data
    doc, blob = encode_payload({name: getattr(data, name) for name in PAYLOAD_FIELDS}, row.id)
    record: dict[str, Any] = {"id": row.id}
    for name in _META:
        record[name] = getattr(meta, name)
    for name in _SCALARS:
        record[name] = getattr(data, name)
    record["data"] = doc
    if blob is not None and not binary:
        record["tensors"] = base64.b64encode(blob).decode("ascii")
    else:
        record["tensors"] = blob
    return record


def record_to_row(record: dict[str, Any], where: str = "record") -> DataRow:
    """The row a record describes, validated; ``where`` names the record in errors."""
    if not isinstance(record, dict):
        raise CodecError(f"{where}: expected a JSON object, got {type(record).__name__}")
    missing = sorted(_REQUIRED - set(record))
    if missing:
        raise CodecError(
            f"{where}: missing {', '.join(missing)}; a record has the columns "
            f"{', '.join(COLUMNS)} (as written by expstore export)"
        )
    unknown = sorted(set(record) - set(COLUMNS))
    if unknown:
        raise CodecError(
            f"{where}: unknown column {', '.join(map(repr, unknown))}; a record has the "
            f"columns {', '.join(COLUMNS)}"
        )
    row_id = record["id"]
    doc = record["data"]
    if isinstance(doc, str):
        try:
            doc = _loads(doc, f"{where}: data")
        except json.JSONDecodeError as exc:
            raise CodecError(f"{where}: data is not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or set(doc) - set(PAYLOAD_FIELDS):
        raise CodecError(
            f"{where}: data must be a JSON object with keys among {', '.join(PAYLOAD_FIELDS)}"
        )
    blob = record.get("tensors")
    if isinstance(blob, str):
        try:
            blob = base64.b64decode(blob, validate=True)
        except (binascii.Error, ValueError):
            raise CodecError(f"{where}: tensors is not valid base64") from None
    elif blob is not None and not isinstance(blob, (bytes, bytearray, memoryview)):
        raise CodecError(f"{where}: tensors must be base64 text, bytes or null")
    try:
        payload = decode_payload(doc, blob, row_id=str(row_id))
        return DataRow(
            id=row_id,
            exp_meta=ExpMeta.model_validate(
                {name: record[name] for name in _META if name in record}
            ),
            exp_data=Experience(
                **payload,
                **{name: record[name] for name in _SCALARS if record.get(name) is not None},
            ),
        )
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'row'}: {e['msg']}" for e in exc.errors()
        )
        raise CodecError(f"{where}: {problems}") from None
    except CodecError as exc:
        raise CodecError(f"{where}: {exc}") from None


# ---------------------------------------------------------------------------------------
# Export


#: Which arrays to write as images: ``"auto"``, field paths, or None for none.
Images = str | Sequence[str] | None


def export_rows(
    buffer: Rows,
    path: str | os.PathLike[str],
    format: str | None = None,
    query_condition: QueryCondition = None,
    *,
    progress: Progress | None = None,
    images: Images = None,
) -> int:
    """Write the matching rows of ``buffer`` to ``path`` in insertion order; returns how many.

    ``format`` is ``"jsonl"`` or ``"parquet"`` (default: from the suffix). The file appears
    whole or not at all: rows go to ``<path>.partial``, renamed when complete. ``"-"``
    writes JSON Lines to standard output.

    ``images`` (Parquet only; needs Pillow, ``pip install 'expstore[images]'``): ``"auto"``
    or field paths (``["exp_data.state.screenshot"]``) whose uint8 image arrays become
    Hugging Face ``Image`` columns ``image.<path>`` (PNG bytes) that ``datasets`` shows as
    images (see :mod:`expstore.model.arrow` and :mod:`expstore.model.images`). A named path
    holding something else than an image stops the export with an error naming the row, and
    no file is left. The rows themselves are exported whole either way.
    """
    format = detect_format(path, format)
    selection = _image_selection(images, format)
    rows = buffer.query(query_condition)
    if format == "jsonl":
        return _export_jsonl(rows, path, progress)
    return _export_parquet(rows, path, buffer, query_condition, progress, selection)


def _image_selection(images: Images, format: str = "parquet") -> ImageSelection | None:
    selection = ImageSelection.parse(images)
    if selection is None:
        return None
    if format != "parquet":
        raise InvalidArgumentError(
            "images= makes Hugging Face image columns, which only Parquet holds; export to "
            "a *.parquet file (JSON Lines keep every array in the tensors column), or write "
            "the images as PNG files with export_images (expstore export --images DIR)"
        )
    require_pillow("exporting images (images=)")
    return selection


@contextmanager
def replacing(path: str | os.PathLike[str], mode: str) -> Iterator[tuple[IO[Any], Path]]:
    target = Path(path)
    partial = target.with_name(target.name + ".partial")
    try:
        with open(partial, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f, partial
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def _export_jsonl(
    rows: Iterable[DataRow], path: str | os.PathLike[str], progress: Progress | None
) -> int:
    def write(out: IO[str]) -> int:
        count = 0
        for row in rows:
            out.write(json.dumps(row_to_record(row), ensure_ascii=False, allow_nan=False))
            out.write("\n")
            count += 1
            if progress is not None:
                progress(1)
        return count

    if str(path) == "-":
        return write(sys.stdout)
    with replacing(path, "w") as (out, _):
        return write(out)


def _arrow_schema(pa: Any) -> Any:
    """The Parquet schema: each layout column's Arrow type follows its Python type."""
    types = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}
    return pa.schema(
        [
            ("id", pa.string()),
            *((c.name, types[c.python]) for c in LAYOUT),
            ("data", pa.string()),
            ("tensors", pa.binary()),
        ]
    )


def _export_parquet(
    rows: Iterable[DataRow],
    path: str | os.PathLike[str],
    buffer: Rows,
    query_condition: QueryCondition,
    progress: Progress | None,
    images: ImageSelection | None = None,
) -> int:
    if str(path) == "-":
        raise InvalidArgumentError("Parquet cannot be written to standard output; give a file name")
    pa = require("pyarrow", "exporting to Parquet")
    pq = require("pyarrow.parquet", "exporting to Parquet")
    about = {
        "format": "expstore-rows",
        "version": 1,
        "expstore": __version__,
        "buffer": buffer.storage.name,
        "where": None if query_condition is None else _describe(query_condition),
    }
    count = 0
    with replacing(path, "wb") as (out, _):
        writer = None
        try:
            for table in arrow_chunks(pa, rows, about, images):
                if writer is None:
                    writer = pq.ParquetWriter(out, table.schema)
                writer.write_table(table)
                count += table.num_rows
                if progress is not None:
                    progress(table.num_rows)
            if writer is None:  # no rows: an empty file with the base columns
                writer = pq.ParquetWriter(out, _schema(pa, [], about))
        finally:
            if writer is not None:
                writer.close()
    return count


def _schema(
    pa: Any,
    tensors: list[TensorColumn],
    about: dict[str, Any],
    images: Sequence[ImageColumn] = (),
) -> Any:
    base = _arrow_schema(pa)
    fields = [
        *base,
        *tensor_fields(pa, tensors),
        *image_fields(pa, images),
        pa.field("execute_time_us", pa.int64()),
    ]
    metadata = {"expstore": json.dumps(about)}
    schema = pa.schema(fields)
    if images:
        metadata.update(hf_features(pa, schema, images))
    return schema.with_metadata(metadata)


def arrow_chunks(
    pa: Any,
    rows: Iterable[DataRow],
    about: dict[str, Any],
    images: ImageSelection | None = None,
) -> Iterator[Any]:
    """Arrow tables of ``rows``, :data:`CHUNK` at a time (fewer once their arrays reach
    :data:`CHUNK_BYTES`), all with one schema: the export's columns, the array columns the
    first chunk agrees on and the image columns ``images`` names or (``"auto"``) the first
    chunk holds (see :mod:`expstore.model.arrow`)."""
    schema = None
    tensors: list[TensorColumn] = []
    pictures: list[ImageColumn] = []
    for chunk in _sized_chunks(rows):
        if schema is None:
            tensors = tensor_columns(chunk)
            if images is not None:
                pictures = image_columns(chunk, images)
                replaced = {c.dotted for c in pictures}
                tensors = [t for t in tensors if t.path not in replaced]
            schema = _schema(pa, tensors, about, pictures)
        columns: dict[str, Any] = {name: [] for name in COLUMNS}
        for row in chunk:
            record = row_to_record(row, binary=True)
            record["data"] = json.dumps(record["data"], ensure_ascii=False, allow_nan=False)
            for name in COLUMNS:
                columns[name].append(record[name])
        columns.update(tensor_table(pa, chunk, tensors))
        columns.update(image_table(pa, chunk, pictures))
        yield pa.Table.from_pydict(columns, schema=schema)


def to_arrow(buffer: Rows, query_condition: QueryCondition = None, *, images: Images = None) -> Any:
    """The matching rows as one Arrow table (see :mod:`expstore.model.arrow`); ``images``
    as for :func:`export_rows`."""
    pa = require("pyarrow", "to_arrow()")
    selection = _image_selection(images)
    about = {"format": "expstore-rows", "version": 1, "expstore": __version__}
    tables = list(arrow_chunks(pa, buffer.query(query_condition), about, selection))
    if not tables:
        pictures = [] if selection is None else image_columns([], selection)
        return _schema(pa, [], about, pictures).empty_table()
    return pa.concat_tables(tables)


# ---------------------------------------------------------------------------------------
# Images as PNG files


def export_images(
    buffer: Rows,
    directory: str | os.PathLike[str],
    query_condition: QueryCondition = None,
    *,
    images: Images = "auto",
    progress: Progress | None = None,
) -> int:
    """Write each image array of the matching rows as a PNG file for a quick look; returns
    how many files were written.

    ``images`` is ``"auto"`` (every uint8 ``HxW``/``HxWx3``/``HxWx4`` array at least 16
    pixels high and wide) or field paths, as for :func:`export_rows`. The files are
    ``<directory>/<path>/<row id>.png`` (``shots/state.screenshot/r-17.png``): the row id
    and the path with every character but letters, digits, ``.``, ``_`` and ``-`` made
    ``_``, no leading dot, at most 100 characters, and a short hash of the original when
    anything was changed, so no row id can name a file outside ``directory``; a name
    already taken in this export (ids that differ only in case) gets ``-<n>`` added.
    Files of the same name are replaced; nothing else in ``directory`` is touched. Every
    file is written (in a hidden folder inside ``directory``) before any is moved into
    place: a named path that holds something else than an image stops with an error
    naming the row, and no file is left. Needs Pillow (``pip install 'expstore[images]'``).
    """
    selection = ImageSelection.parse(images)
    if selection is None:
        raise InvalidArgumentError(f"images must be {'auto'!r} or field paths, not None")
    require_pillow("exporting images as PNG files")
    target = Path(directory)
    if target.exists() and not target.is_dir():
        raise InvalidArgumentError(f"{str(target)!r} is a file; give a directory for the images")
    created = not target.exists()
    target.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".expstore-images-", dir=target))
    done = False
    try:
        written: dict[Path, Path] = {}  # staged file -> where it goes
        taken: set[str] = set()  # names case-folded: some file systems ignore case
        for row in buffer.query(query_condition):
            for image in selection.find(row):
                where = image.where
                name = Path(_file_part(where)) / f"{_file_part(row.id)}.png"
                if str(name).casefold() in taken:
                    name = name.with_name(f"{_file_part(row.id)}-{len(written)}.png")
                taken.add(str(name).casefold())
                staged = staging / f"{len(written)}.png"
                staged.write_bytes(png_bytes(image.array, f"row {row.id}: exp_data.{where}"))
                written[staged] = name
            if progress is not None:
                progress(1)
        folders = {target / name.parent for name in written.values()}
        for folder in sorted(folders):
            if folder.exists() and not folder.is_dir():
                raise InvalidArgumentError(
                    f"{str(folder)!r} is a file, where the images of {folder.name} go; move "
                    "it, or write the images to another directory"
                )
        for folder in folders:
            folder.mkdir(exist_ok=True)
        for staged, name in written.items():
            os.replace(staged, target / name)
        done = True
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if created and not done:
            shutil.rmtree(target, ignore_errors=True)  # made here, holds nothing else
    return len(written)


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_MAX_NAME = 100


def _file_part(text: str) -> str:
    """``text`` as one safe file name: only ``[A-Za-z0-9._-]``, no leading dot (so never
    ``.`` or ``..``), at most :data:`_MAX_NAME` characters; a hash of ``text`` is added
    whenever anything was changed, so different texts keep different names."""
    safe = _UNSAFE.sub("_", text).lstrip(".")
    if safe == text and 0 < len(safe) <= _MAX_NAME:
        return safe
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()
    return f"{safe[: _MAX_NAME - len(digest) - 1]}-{digest}".lstrip("-")


def _describe(query_condition: QueryCondition) -> str:
    return str(as_condition(query_condition))


def _sized_chunks(rows: Iterable[DataRow]) -> Iterator[list[DataRow]]:
    """``rows`` in chunks of :data:`CHUNK` rows, or fewer once their arrays and bytes
    reach :data:`CHUNK_BYTES`."""
    chunk: list[DataRow] = []
    size = 0
    for row in rows:
        chunk.append(row)
        size += sum(_payload_bytes(getattr(row.exp_data, name)) for name in PAYLOAD_FIELDS)
        if len(chunk) == CHUNK or size >= CHUNK_BYTES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _payload_bytes(value: Any) -> int:
    """The bytes of the arrays, tensors and bytes inside ``value``."""
    if isinstance(value, dict):
        return sum(_payload_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_payload_bytes(v) for v in value)
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    nbytes = getattr(value, "nbytes", None)  # numpy arrays and torch tensors
    return nbytes if isinstance(nbytes, int) else 0


def chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


# ---------------------------------------------------------------------------------------
# Import


def count_records(path: str | os.PathLike[str], format: str | None = None) -> int | None:
    """How many records a file holds (cheaply: lines or Parquet metadata); None for stdin."""
    format = detect_format(path, format)
    if str(path) == "-":
        return None
    if format == "parquet":
        pq = require("pyarrow.parquet", "reading Parquet")
        return int(pq.ParquetFile(path).metadata.num_rows)
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def _loads(text: str, where: str) -> Any:
    """``json.loads(text)``; CodecError naming the depth limit for JSON nested too deep for
    the parser (Python's recursion limit), which no row could hold anyway."""
    try:
        return json.loads(text)
    except RecursionError:
        raise CodecError(
            f"{where}: lists and dicts nest too deep to read; a row's payload fields nest at "
            f"most {MAX_DEPTH} levels deep. Store a flatter structure"
        ) from None


def _read_jsonl(path: str | os.PathLike[str]) -> Iterator[DataRow]:
    def rows(lines: Iterable[str]) -> Iterator[DataRow]:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{'stdin' if str(path) == '-' else Path(path).name} line {number}"
            try:
                record = _loads(line, where)
            except json.JSONDecodeError as exc:
                raise CodecError(f"{where}: not valid JSON ({exc.msg} at char {exc.pos})") from None
            yield record_to_row(record, where)

    if str(path) == "-":
        yield from rows(sys.stdin)
        return
    with open(path, encoding="utf-8") as f:
        yield from rows(f)


def _read_parquet(path: str | os.PathLike[str]) -> Iterator[DataRow]:
    pq = require("pyarrow.parquet", "importing Parquet")
    pa = require("pyarrow", "importing Parquet")
    try:
        parquet = pq.ParquetFile(path)
    except pa.ArrowException as exc:
        raise CodecError(f"{Path(path).name} is not a readable Parquet file: {exc}") from None
    number = 0
    # Only the row's own columns: array columns and execute_time_us are derived from them.
    names = [n for n in parquet.schema_arrow.names if n in COLUMNS]
    for batch in parquet.iter_batches(batch_size=CHUNK, columns=names):
        for record in batch.to_pylist():
            number += 1
            yield record_to_row(record, f"{Path(path).name} row {number}")


def _stopped(exc: ExpstoreError, stored: int) -> ExpstoreError:
    """``exc`` with what an import that stopped had stored and how to go on."""
    if stored:
        what = (
            f"The import stopped there; the {stored} rows before it were stored (each "
            f"{CHUNK}-row chunk commits on its own)"
        )
    else:
        what = "The import stopped there; nothing was stored"
    hint = (
        "fix the file (or the rows it names) and run the same import again with "
        "skip_existing=True (expstore import --skip-existing), which adds only the rows "
        "not stored yet"
    )
    if isinstance(exc, ValidationError):  # pydantic's: not built from a message
        return InvalidArgumentError(f"{exc}\n{what}; {hint}")
    return type(exc)(f"{exc}. {what}; {hint}")


def import_rows(
    buffer: Rows,
    path: str | os.PathLike[str],
    format: str | None = None,
    *,
    skip_existing: bool = False,
    progress: Progress | None = None,
) -> int:
    """Store the rows of an exported file into ``buffer``; returns how many were stored.

    Rows are validated as they are read and stored ``CHUNK`` (1000) at a time, each chunk
    in one transaction. A bad line, an invalid row or a row whose id the buffer already
    holds (unless ``skip_existing``, which leaves such rows out) stops the import with an
    error of its kind that says how many rows of earlier chunks were stored and how to go
    on: fix the file and run it again with ``skip_existing=True``.
    ``"-"`` reads JSON Lines from standard input.
    """
    format = detect_format(path, format)
    if format == "jsonl":
        rows = _read_jsonl(path)
    else:
        rows = _read_parquet(path)
    stored = 0
    try:
        for chunk in chunks(rows, CHUNK):
            read = len(chunk)
            if skip_existing:
                ids = [row.id for row in chunk]
                present = {row.id for row in buffer.query(Comparison("id", "in", tuple(ids)))}
                chunk = [row for row in chunk if row.id not in present]
            if chunk:
                buffer.store_batch(chunk)
                stored += len(chunk)
            if progress is not None:
                progress(read)
    except ExpstoreError as exc:
        raise _stopped(exc, stored) from exc
    return stored
