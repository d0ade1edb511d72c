"""Export the consumption record of each row (see :meth:`ReplayBuffer.lineage`) to JSON Lines
or Parquet, for looking back at which learner trained on what, when, and from which
checkpoint::

    from .lineage_io import export_lineage
    export_lineage(buffer, "lineage.parquet")   # one record per matching row

Each record: the row's ``id``, ``task_id``, ``agent_id`` and ``step``, then ``state``
(unclaimed, leased, expired, consumed), ``consumer``, ``claimed_at``, ``lease_until``,
``acked_at`` (seconds since the epoch, database clock), ``checkpoint`` (the JSON the row was
acked with; as JSON text in Parquet), ``checkpoint_seq``, ``times_claimed`` and
``times_sampled``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from ._optional import require
from .buffer import ReplayBuffer
from .claims.queue import Lineage
from .errors import InvalidArgumentError
from .io import CHUNK, Progress, chunks, detect_format, replacing
from .query import QueryCondition

__all__ = ["LINEAGE_FIELDS", "export_lineage", "lineage_records"]

#: The fields of a lineage record, in order.
LINEAGE_FIELDS = ("id", "task_id", "agent_id", "step", *Lineage._fields)


def lineage_records(
    buffer: ReplayBuffer, query_condition: QueryCondition = None
) -> Iterator[dict[str, Any]]:
    """One record per matching row, in insertion order, read a chunk of rows at a time."""
    for chunk in chunks(buffer.query(query_condition), CHUNK):
        found = buffer.lineage([row.id for row in chunk])
        for row in chunk:
            record = found.get(row.id)
            if record is None:  # deleted since the chunk was read
                continue
            meta = row.exp_meta
            yield {
                "id": row.id,
                "task_id": meta.task_id,
                "agent_id": meta.agent_id,
                "step": meta.step,
                **record._asdict(),
            }


def export_lineage(
    buffer: ReplayBuffer,
    path: str | os.PathLike[str],
    format: str | None = None,
    query_condition: QueryCondition = None,
    *,
    progress: Progress | None = None,
) -> int:
    """Write the lineage records of the matching rows to ``path`` (``"jsonl"`` or
    ``"parquet"``, default from the suffix; ``"-"``: JSON Lines to standard output); the
    file appears whole or not at all. Returns how many records were written."""
    format = detect_format(path, format)
    records = lineage_records(buffer, query_condition)
    count = 0
    if format == "jsonl":
        with replacing(path, "w") as (out, _):
            for record in records:
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
                count += 1
                if progress is not None:
                    progress(1)
        return count
    if str(path) == "-":
        raise InvalidArgumentError("Parquet cannot be written to standard output; give a file name")
    pa = require("pyarrow", "exporting to Parquet")
    pq = require("pyarrow.parquet", "exporting to Parquet")
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("task_id", pa.string()),
            ("agent_id", pa.string()),
            ("step", pa.int64()),
            ("state", pa.string()),
            ("consumer", pa.string()),
            ("claimed_at", pa.float64()),
            ("lease_until", pa.float64()),
            ("acked_at", pa.float64()),
            ("checkpoint", pa.string()),
            ("checkpoint_seq", pa.int64()),
            ("times_claimed", pa.int64()),
            ("times_sampled", pa.int64()),
            ("evicted_at", pa.float64()),
            ("evicted_by", pa.string()),
            ("eviction_policy", pa.string()),
        ]
    )
    with replacing(path, "wb") as (out, _), pq.ParquetWriter(out, schema) as writer:
        for chunk in chunks(records, CHUNK):
            for record in chunk:
                if record["checkpoint"] is not None:
                    record["checkpoint"] = json.dumps(record["checkpoint"])
            writer.write_table(pa.Table.from_pylist(chunk, schema=schema))
            count += len(chunk)
            if progress is not None:
                progress(len(chunk))
    return count
