"""Arrays stored once: each array of at least the codec's threshold is stored by its digest
in ``expstore_arrays``, once per buffer however many rows hold it, and each row that
refers to one has an entry in ``expstore_array_refs``.

The table stays exact in the transaction of the rows: a write stores the arrays its rows
refer to that the buffer lacks, and their references, before it commits; a removal
(eviction, ``delete``, retention) deletes the arrays the removed rows referred to that no
row refers to any more, after the rows (whose references go with them, ON DELETE CASCADE);
``clear`` deletes them all. Writers and removals of a buffer take turns on its row, so no
other transaction adds a reference between the check and the delete. A process killed at
any point leaves the transaction uncommitted: no reference without its array, no array
without a reference.

Reads fetch the arrays their rows refer to in the same read (:func:`fetch_arrays`), so a
row and its arrays are one snapshot; a read of fields that hold no array never touches
this table.

The buffer's setting (``compression``, ``max_array_bytes``, and per payload path the
compression of the arrays under it, ``fields``) lives in its row of ``expstore_buffers``,
the same for every writer, read by each write as it takes the row. Under a path of
``fields`` the most specific path that holds an array sets its codec; an array stored once
for two paths keeps the codec of the first row that stored it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from sqlalchemy import Connection, case, delete, exists, func, insert, null, select, update

from .._args import check_int
from ..codec.compression import (
    DEFAULT_MAX_ARRAY_BYTES,
    EXTERNAL_THRESHOLD,
    check_compression,
    pack_array,
)
from ..codec.tracked import node_at
from ..db.dialects import WRITE_COLUMNS
from ..db.handle import BufferHandle
from ..db.row_ids import ids_to_keys
from ..db.schema import array_refs, arrays, buffers
from ..errors import InvalidArgumentError, QueryError
from ..lifecycle.hooks import RemoveContext, RowFeature, WriteContext, register
from ..model.paths import FieldPath
from ..query.fields import resolve_field

__all__ = [
    "ArraySetting",
    "Externals",
    "array_stats",
    "check_fields",
    "check_setting",
    "digests_in",
    "drop_all",
    "fetch_arrays",
    "note_codecs",
    "read_setting",
    "referred_by",
    "set_compression",
    "setting_of",
    "store_arrays",
    "sweep",
]

#: (digest, array) of each array a row refers to by digest, by row id.
Externals = Mapping[str, Sequence[tuple[str, Any]]]
_DIGEST = re.compile(r'"digest":\s*"([0-9a-f]{32})"')  # (Postgres writes jsonb with spaces)
_CHUNK = 500
#: Stored arrays larger than this are read in pieces of this size.
PIECE = 64 << 20
#: Arrays packed at once in threads (zstd and Pillow release the GIL).
_PACKERS = 2


class ArraySetting(NamedTuple):
    """A buffer's setting for arrays: the codec of new arrays, the largest array, and per
    payload path (canonical) the codec of the arrays under it."""

    compression: str | None
    max_array_bytes: int
    fields: dict[str, str | None]


def setting_of(
    compression: str | None, max_array_bytes: int | None, fields: str | None = None
) -> ArraySetting:
    """The setting as the buffer's row stores it (NULL: the default; ``"none"``: raw)."""
    mode = _mode(compression)
    by_path = {} if fields is None else {p: _mode(c) for p, c in json.loads(fields).items()}
    return ArraySetting(
        mode,
        DEFAULT_MAX_ARRAY_BYTES if max_array_bytes is None else int(max_array_bytes),
        by_path,
    )


def read_setting(conn: Connection, buffer_id: int) -> ArraySetting:
    """The buffer's setting as its row holds it now."""
    stmt = select(
        buffers.c.compression, buffers.c.max_array_bytes, buffers.c.compression_fields
    ).where(buffers.c.id == buffer_id)
    return setting_of(*conn.execute(stmt).one())


def _mode(stored: str | None) -> str | None:
    return "auto" if stored is None else (None if stored == "none" else stored)


def check_setting(compression: Any, max_array_bytes: Any, fields: Any = None) -> None:
    """InvalidArgumentError (or MissingDependencyError) unless all are valid."""
    check_compression(compression)
    check_int("max_array_bytes", max_array_bytes, minimum=EXTERNAL_THRESHOLD, optional=True)
    if fields is not None:
        check_fields(fields)


def check_fields(fields: Any) -> dict[str, str | None]:
    """``fields`` (payload paths to compression settings) by canonical path, or
    InvalidArgumentError saying what is wrong."""
    if not isinstance(fields, Mapping):
        raise InvalidArgumentError(
            "fields must map payload paths to compression settings, like "
            f"{{'exp_data.state.screenshot': 'png'}}, got {fields!r}. Nothing was changed"
        )
    out: dict[str, str | None] = {}
    for path, codec in fields.items():
        try:
            field = resolve_field(path)
        except QueryError as exc:
            raise InvalidArgumentError(
                f"cannot set the compression of {path!r}: {exc}. Nothing was changed"
            ) from None
        if field.column is not None:
            raise InvalidArgumentError(
                f"cannot set the compression of {path!r}: it is a column, which holds no "
                "arrays; name a payload path such as 'exp_data.state.screenshot'. Nothing "
                "was changed"
            )
        try:
            out[field.canonical] = check_compression(codec)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"fields[{path!r}]: {exc}") from None
    return out


def set_compression(
    handle: BufferHandle,
    conn: Connection,
    compression: Any,
    max_array_bytes: Any,
    fields: Any = None,
) -> None:
    """Store the buffer's setting in the caller's transaction (which holds its row).
    ``max_array_bytes`` and ``fields`` None keep the ones stored; ``fields`` empty drops
    them."""
    check_setting(compression, max_array_bytes)
    values: dict[str, Any] = {"compression": _stored(compression)}
    if max_array_bytes is not None:
        values["max_array_bytes"] = max_array_bytes
    if fields is not None:
        by_path = check_fields(fields)
        values["compression_fields"] = (
            json.dumps({p: _stored(c) for p, c in sorted(by_path.items())}) if by_path else None
        )
    conn.execute(update(buffers).where(buffers.c.id == handle.buffer_id).values(values))


def _stored(compression: str | None) -> str:
    return "none" if compression is None else compression


_ID_AT = WRITE_COLUMNS.index("id")
_DATA_AT = WRITE_COLUMNS.index("data")


def note_codecs(
    setting: ArraySetting,
    chunks: Iterable[list[tuple[Any, ...]]],
    externals: Externals,
    codecs: dict[str, str | None],
) -> Iterator[list[tuple[Any, ...]]]:
    """``chunks`` (encoded rows) as they are, noting in ``codecs`` the codec of each array
    stored by digest under a path of ``setting.fields`` as the rows go by (in a row, the
    most specific path wins; an array in several rows keeps the codec of the first);
    ``externals`` holds the arrays of each row encoded so far."""
    rules: list[tuple[FieldPath, str | None]] = sorted(
        ((resolve_field(path), codec) for path, codec in setting.fields.items()),
        key=lambda rule: len(rule[0].steps),
    )
    for chunk in chunks:
        for values in chunk:
            if values[_ID_AT] not in externals:
                continue
            doc = values[_DATA_AT]
            if type(doc) is not dict:
                doc = json.loads(doc)
            mine: dict[str, str | None] = {}
            for field, codec in rules:
                node = node_at(doc, str(field.top), field.steps, unescape=True)
                if type(node) is dict or type(node) is list:
                    for digest in _DIGEST.findall(json.dumps(node)):
                        mine[digest] = codec
            for digest, codec in mine.items():
                codecs.setdefault(digest, codec)
        yield chunk


def store_arrays(
    handle: BufferHandle,
    conn: Connection,
    externals: Externals,
    compression: str | None,
    keys: Mapping[str, int] | None = None,
    codecs: Mapping[str, str | None] | None = None,
) -> int:
    """Store the arrays the rows just inserted refer to that the buffer lacks, and the
    rows' references, in the caller's transaction; returns how many arrays were new. Rows
    of ``externals`` that were not inserted (left out as duplicates) are skipped.
    ``keys``: the inserted rows' keys by id, if the caller has them; ``codecs``: the
    compression of some arrays by digest, over ``compression`` (see :func:`note_codecs`)."""
    if not externals:
        return 0
    if keys is None:
        keys = ids_to_keys(handle, conn, list(externals))
    buffer_id = handle.buffer_id
    refs: dict[tuple[int, str], None] = {}
    wanted: dict[str, Any] = {}
    for row_id, held in externals.items():
        key = keys.get(row_id)
        if key is None:
            continue
        for digest, array in held:
            refs[(key, digest)] = None
            wanted.setdefault(digest, array)
    present = _present(conn, buffer_id, list(wanted))
    new = [(digest, array) for digest, array in wanted.items() if digest not in present]
    for start in range(0, len(new), _PACKERS * 4):
        part = new[start : start + _PACKERS * 4]
        packed = _packed([(d, a, compression if codecs is None else codecs.get(d, compression))
                          for d, a in part])  # fmt: skip
        conn.execute(
            insert(arrays),
            [
                {"buffer_id": buffer_id, "digest": d, "nbytes": a.nbytes, "data": data}
                for (d, a), data in zip(part, packed, strict=True)
            ],
        )
    if refs:
        conn.execute(
            insert(array_refs),
            [{"key": k, "digest": d, "buffer_id": buffer_id} for k, d in refs],
        )
    return len(new)


def _packed(part: list[tuple[str, Any, str | None]]) -> list[bytes]:
    """Each array (digest, array, compression) packed (in threads when it pays)."""
    if len(part) == 1 or all(codec is None for _, _, codec in part):
        return [pack_array(a, d, codec) for d, a, codec in part]
    with ThreadPoolExecutor(_PACKERS, thread_name_prefix="expstore-pack") as pool:
        return list(pool.map(lambda item: pack_array(item[1], item[0], item[2]), part))


def _present(conn: Connection, buffer_id: int, digests: list[str]) -> set[str]:
    found: set[str] = set()
    for start in range(0, len(digests), _CHUNK):
        stmt = select(arrays.c.digest).where(
            arrays.c.buffer_id == buffer_id,
            arrays.c.digest.in_(digests[start : start + _CHUNK]),
        )
        found.update(conn.execute(stmt).scalars())
    return found


def referred_by(handle: BufferHandle, conn: Connection, keys: list[int]) -> set[str]:
    """The digests the rows with these keys refer to."""
    stmt = select(array_refs.c.digest).where(handle.dialect.key_in(array_refs.c.key)).distinct()
    return set(conn.execute(stmt, {"keys": handle.dialect.key_set(keys)}).scalars())


def sweep(conn: Connection, buffer_id: int, digests: Iterable[str]) -> int:
    """Delete the buffer's arrays among ``digests`` that no row refers to any more;
    returns how many went."""
    candidates = sorted(set(digests))
    gone = 0
    for start in range(0, len(candidates), _CHUNK):
        referred = exists().where(
            array_refs.c.buffer_id == arrays.c.buffer_id,
            array_refs.c.digest == arrays.c.digest,
        )
        stmt = delete(arrays).where(
            arrays.c.buffer_id == buffer_id,
            arrays.c.digest.in_(candidates[start : start + _CHUNK]),
            ~referred,
        )
        gone += int(conn.execute(stmt).rowcount)
    return gone


def drop_all(conn: Connection, buffer_id: int) -> None:
    """Delete every array of the buffer (its rows are gone: ``clear``)."""
    conn.execute(delete(arrays).where(arrays.c.buffer_id == buffer_id))


def digests_in(texts: Iterable[Any]) -> set[str]:
    """The digests the placeholders in these JSON texts name (None and non-text skipped;
    a user's string that looks like one only costs a look-up that finds nothing)."""
    found: set[str] = set()
    for text in texts:
        if type(text) is str and '"digest":' in text:
            found.update(_DIGEST.findall(text))
    return found


def fetch_arrays(conn: Connection, buffer_id: int, digests: Iterable[str]) -> dict[str, bytes]:
    """The stored bytes of the buffer's arrays with these digests (missing ones left out:
    the decoder names the row that refers to one). Stored bytes over :data:`PIECE` come in
    pieces: Postgres sends a ``bytea`` as hex text, twice its size, and refuses any value
    of 1 GB or more."""
    wanted = sorted(set(digests))
    out: dict[str, bytes] = {}
    large: list[tuple[str, int]] = []
    size = func.length(arrays.c.data)
    for start in range(0, len(wanted), _CHUNK):
        stmt = select(
            arrays.c.digest, size, case((size <= PIECE, arrays.c.data), else_=null())
        ).where(
            arrays.c.buffer_id == buffer_id, arrays.c.digest.in_(wanted[start : start + _CHUNK])
        )
        for digest, length, data in conn.execute(stmt):
            if data is None:
                large.append((digest, int(length)))
            else:
                out[digest] = bytes(data)
    for digest, length in large:
        mine = (arrays.c.buffer_id == buffer_id, arrays.c.digest == digest)
        pieces = [
            bytes(
                conn.execute(
                    select(func.substr(arrays.c.data, at + 1, PIECE)).where(*mine)
                ).scalar_one()
            )
            for at in range(0, length, PIECE)
        ]
        out[digest] = b"".join(pieces)
    return out


def array_stats(conn: Connection, buffer_id: int) -> tuple[int, int, int]:
    """(arrays stored, their own bytes, their stored bytes) of the buffer."""
    stmt = select(
        func.count(), func.coalesce(func.sum(arrays.c.nbytes), 0),
        func.coalesce(func.sum(func.length(arrays.c.data)), 0),
    ).where(arrays.c.buffer_id == buffer_id)  # fmt: skip
    count, own, stored = conn.execute(stmt).one()
    return int(count), int(own), int(stored)


class ArraysInUse(NamedTuple):
    """The arrays feature's setting for one write: how arrays are stored, and whether the
    buffer holds any stored by digest (a removal looks for references only then)."""

    setting: ArraySetting
    holds: bool


class _ArraysFeature(RowFeature):
    """Arrays stored once by digest: every write encodes under the buffer's setting and
    stores the arrays its rows refer to; a removal sweeps arrays no row refers to any
    more (only in a buffer that holds some)."""

    name = "arrays"
    order = 40

    def columns(self, buffer_id: Any) -> list[Any]:
        held = select(arrays.c.digest).where(arrays.c.buffer_id == buffer_id).exists()
        return [
            buffers.c.compression,
            buffers.c.max_array_bytes,
            buffers.c.compression_fields,
            held,
        ]

    def setting(self, values: Sequence[Any]) -> Any:
        return ArraysInUse(setting_of(values[0], values[1], values[2]), bool(values[3]))

    # its hooks before the insert read only its settings (not whether arrays are held)
    reads_unlocked = True

    def settings_columns(self, columns: Sequence[Any]) -> Sequence[Any]:
        return columns[:3]

    def prepare(self, ctx: WriteContext, setting: Any) -> None:
        ctx.batch.max_array_bytes = setting.setting.max_array_bytes
        ctx.batch.external.clear()  # (a write tried again encodes its rows again)

    def before_insert(self, ctx: WriteContext, setting: Any) -> None:
        if setting.setting.fields:  # the codec of each array under a path that has its own
            codecs: dict[str, str | None] = {}
            ctx.notes[self.name] = codecs
            ctx.chunks = note_codecs(setting.setting, ctx.chunks, ctx.batch.external, codecs)

    def after_insert(self, ctx: WriteContext, setting: Any) -> None:
        external = ctx.batch.external
        if not external:
            return
        codecs = ctx.notes.get(self.name, {})
        store_arrays(
            ctx.handle, ctx.conn, external, setting.setting.compression, ctx.new_keys(), codecs
        )
        # removals later in this transaction (the write's eviction) look for references
        ctx.state.settings[self.name] = setting._replace(holds=True)

    def quiet_after(self, ctx: WriteContext, setting: Any) -> bool:
        return not ctx.batch.external  # no array of the batch stored apart

    def before_remove(self, ctx: RemoveContext, setting: Any) -> None:
        if setting.holds:
            ctx.notes[self.name] = referred_by(ctx.handle, ctx.conn, ctx.keys)

    def after_remove(self, ctx: RemoveContext, setting: Any) -> None:
        referred = ctx.notes.get(self.name)
        if referred:  # their references went with the rows (ON DELETE CASCADE)
            sweep(ctx.conn, ctx.handle.buffer_id, referred)


register(_ArraysFeature())
