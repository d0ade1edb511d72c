"""Arrays stored once: one stored array per distinct array, exact under eviction, delete,
retention, clear, concurrent writers and SIGKILL, in the rows' transaction; the buffer's
setting kept in the database; reads that never touch arrays they do not need."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import Text, cast, select, update

from expstore import CodecError, CorruptRowError, InvalidArgumentError, NumpyConverter, ReplayBuffer
from expstore.arrays.stored_once import digests_in
from expstore.codec import encode_payload
from expstore.codec.compression import EXTERNAL_THRESHOLD, stored_codec
from expstore.codec.digests import array_digest
from expstore.db.schema import array_refs, arrays, rows
from expstore.io import export_rows, import_rows
from expstore.query import QueryBuilder
from expstore.storage.reader import RowReader
from tests.arrays.arrays_actor import rows_for, screenshots
from tests.helpers import in_threads, killed_actor, make_row

PAGES = screenshots(4)


def consistent(buffer: ReplayBuffer) -> int:
    """Check that the references are exactly the digests the rows' documents name and the
    stored arrays exactly those referred to; returns how many arrays are stored."""
    sql = buffer.sql
    with sql.handle.read() as conn:
        bid = sql.buffer_id
        refs = set(
            conn.execute(
                select(array_refs.c.key, array_refs.c.digest).where(array_refs.c.buffer_id == bid)
            )
        )
        stored = set(
            conn.execute(select(arrays.c.digest).where(arrays.c.buffer_id == bid)).scalars()
        )
        docs = conn.execute(
            select(rows.c.key, cast(rows.c.data, Text)).where(rows.c.buffer_id == bid)
        )
        named = {(key, digest) for key, text in docs for digest in digests_in([text])}
    assert refs == named, "a reference without its row's placeholder, or the other way"
    assert {digest for _, digest in refs} == stored, "a dangling reference or an orphan array"
    return len(stored)


def shots(task: str, pages: list[int]) -> list:
    return [
        make_row(task, "a", step, reward=float(step), state={"screen": PAGES[p], "url": f"u{p}"})
        for step, p in enumerate(pages)
    ]


def test_ten_steps_of_an_unchanged_page_store_one_array(buffer: ReplayBuffer) -> None:
    buffer.store_batch(shots("t", [0] * 10))
    buffer.store_batch(shots("u", [0, 1]))
    assert consistent(buffer) == 2
    count, own, stored = buffer.array_stats()
    assert (count, own) == (2, 2 * PAGES[0].nbytes)
    for row in buffer.query():
        page = PAGES[0] if row.exp_meta.task_id == "t" or row.exp_meta.step == 0 else PAGES[1]
        assert np.array_equal(row.exp_data.state["screen"], page)


def test_eviction_delete_retention_and_clear_keep_the_arrays_exact(buffer: ReplayBuffer) -> None:
    buffer.set_retention(6)
    for batch in range(4):
        buffer.store_batch(shots(f"t{batch}", [batch % 4, (batch + 1) % 4, 2]))
        consistent(buffer)
    assert len(buffer) == 6
    buffer.delete(QueryBuilder().eq("task_id", "t3").build())
    assert consistent(buffer) == len({(b + i) % 4 for b in (2,) for i in (0, 1)} | {2})
    buffer.set_retention(1)
    assert consistent(buffer) == 1
    buffer.clear()
    assert consistent(buffer) == 0


def test_concurrent_writers_of_the_same_pages_store_each_once(
    db_url: str, buffer_name: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as first:
        first.store_batch(shots("seed", [0]))

        def write(i: int) -> None:
            with ReplayBuffer(db_url, name=buffer_name) as mine:
                for j in range(3):
                    mine.store_batch(shots(f"w{i}-{j}", [0, 1, 2, 3, (i + j) % 4]))

        in_threads(write, 4)
        assert consistent(first) == 4
        assert len(first) == 1 + 4 * 3 * 5


@pytest.mark.parametrize("point", ["before-arrays", "after-arrays", "before-sweep", "after-sweep"])
def test_a_writer_killed_inside_its_write_leaves_no_dangling_reference_and_no_orphan(
    db_url: str, buffer_name: str, point: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name, capacity=8):
        pass
    killed_actor("tests.arrays.arrays_actor", db_url, buffer_name, point)
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        assert {r.exp_meta.task_id for r in buffer.query()} == {"b0", "b1"}  # 12 rows, cap 8
        consistent(buffer)
        for row in buffer.query():
            assert row.exp_data.state["screen"].shape == (128, 256, 3)
        buffer.store_batch(rows_for(2, PAGES))  # and it goes on
        consistent(buffer)


def test_the_setting_is_kept_in_the_database_for_every_writer(
    db_url: str, buffer_name: str
) -> None:
    with (
        ReplayBuffer(db_url, name=buffer_name) as one,
        ReplayBuffer(db_url, name=buffer_name) as two,
    ):
        one.set_compression("png")
        two.store_batch(shots("t", [0]))
        one.set_compression(None)
        two.store_batch(shots("u", [1]))
        with one.sql.handle.read() as conn:
            codecs = dict(
                (d, stored_codec(bytes(data)))
                for d, data in conn.execute(
                    select(arrays.c.digest, arrays.c.data).where(
                        arrays.c.buffer_id == one.sql.buffer_id
                    )
                )
            )
        assert sorted(codecs.values()) == ["png", "raw"]
        with pytest.raises(InvalidArgumentError, match="compression must be one of"):
            one.set_compression("gzip")
        with pytest.raises(InvalidArgumentError, match="max_array_bytes"):
            one.set_compression("zstd", max_array_bytes=10)
        two.store_batch(shots("v", [2]))  # still raw: the bad settings changed nothing
        assert consistent(two) == 3


def _codecs(buffer: ReplayBuffer) -> dict[str, str]:
    """The codec each stored array of the buffer was packed with, by digest."""
    with buffer.sql.handle.read() as conn:
        stmt = select(arrays.c.digest, arrays.c.data).where(
            arrays.c.buffer_id == buffer.sql.buffer_id
        )
        return {d: stored_codec(bytes(data)) for d, data in conn.execute(stmt)}


def test_fields_set_the_compression_under_their_paths_the_most_specific_winning(
    db_url: str, buffer_name: str
) -> None:
    rng = np.random.default_rng(3)
    noise = [rng.integers(0, 255, EXTERNAL_THRESHOLD, dtype=np.uint8) for _ in range(2)]
    floats = np.linspace(0, 1, EXTERNAL_THRESHOLD // 4, dtype=np.float32)
    with (
        ReplayBuffer(db_url, name=buffer_name) as one,
        ReplayBuffer(db_url, name=buffer_name) as two,
    ):
        assert one.compression().fields == {}
        one.set_compression(
            "zstd",
            fields={
                "exp_data.state": None,  # raw under state...
                "exp_data.state.frames": "png",  # ...but for frames (a list of images)
                "exp_data.next_state.screen": "png",
            },
        )
        setting = two.compression()  # kept in the database for every handle
        assert setting.compression == "zstd"
        assert dict(setting.fields) == {
            "exp_data.state": None,
            "exp_data.state.frames": "png",
            "exp_data.next_state.screen": "png",
        }
        row = make_row(
            "t", "a", 0,
            state={"noise": noise[0], "frames": [PAGES[0], PAGES[1]]},
            next_state={"screen": PAGES[2], "floats": floats},
            actions=[{"noise": noise[1]}],
        )  # fmt: skip
        two.store_batch([row])
        found = _codecs(two)
        d = array_digest
        assert found[d(noise[0])] == "raw"
        assert found[d(PAGES[0])] == found[d(PAGES[1])] == found[d(PAGES[2])] == "png"
        assert found[d(floats)] in ("zstd", "zstd+shuffle")  # the buffer's own setting
        assert found[d(noise[1])] in ("zstd", "raw")  # zstd that gains nothing is raw
        (back,) = list(two.query())
        assert np.array_equal(back.exp_data.state["frames"][1], PAGES[1])
        assert np.array_equal(back.exp_data.next_state["floats"], floats)
        one.set_compression("zstd")  # fields None: kept
        assert len(two.compression().fields) == 3
        one.set_compression("auto", fields={})  # dropped
        assert two.compression() == ("auto", one.compression().max_array_bytes, {})
        consistent(two)


def test_fields_see_through_escaped_objects_and_the_first_row_sets_a_shared_array(
    buffer: ReplayBuffer,
) -> None:
    """A path under an object the codec escaped (a reserved key beside it) still sets its
    arrays' codec; an array two rows hold under paths of different codecs keeps the first
    row's."""
    buffer.set_compression("zstd", fields={"exp_data.state.img": None, "exp_data.actions": "zstd"})
    shared = np.full((128, 256, 3), 7, np.uint8)  # zstd gains on it
    buffer.store_batch(
        [
            make_row("t", "a", 0, state={"__float__": 1, "img": PAGES[0]}),
            make_row("t", "a", 1, actions=[shared]),  # zstd (first)
            make_row("t", "a", 2, state={"img": shared}),  # raw asked: stored already
        ]
    )
    found = _codecs(buffer)
    assert found[array_digest(PAGES[0])] == "raw"
    assert found[array_digest(shared)] == "zstd"
    (row,) = [r for r in buffer.query() if r.exp_meta.step == 0]
    assert row.exp_data.state["__float__"] == 1
    assert np.array_equal(row.exp_data.state["img"], PAGES[0])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"reward_t": "zstd"}, "it is a column, which holds no arrays"),
        ({"exp_data.nosuch.x": "zstd"}, "cannot set the compression of 'exp_data.nosuch.x'"),
        ({"exp_data.state.screen": "gzip"}, r"fields\['exp_data.state.screen'\]: compression must"),
        (["exp_data.state.screen"], "fields must map payload paths to compression settings"),
    ],
)
def test_bad_fields_are_refused_and_change_nothing(
    buffer: ReplayBuffer, fields: object, message: str
) -> None:
    buffer.set_compression("png", fields={"exp_data.state.screen": None})
    before = buffer.compression()
    with pytest.raises(InvalidArgumentError, match=message):
        buffer.set_compression("zstd", fields=fields)  # type: ignore[arg-type]
    assert buffer.compression() == before
    buffer.store_batch(shots("t", [0]))
    assert list(_codecs(buffer).values()) == ["raw"]


def test_an_array_over_the_maximum_stores_nothing(buffer: ReplayBuffer) -> None:
    buffer.store_batch(shots("t", [0]))
    buffer.set_compression("auto", max_array_bytes=EXTERNAL_THRESHOLD)
    big = np.zeros(EXTERNAL_THRESHOLD + 1, np.uint8)
    with pytest.raises(
        CodecError, match=r"state\.big: the array of 65537 bytes .* max_array_bytes"
    ):
        buffer.store_batch([make_row("u", "a", 0, state={"big": big}), *shots("u", [1])])
    assert len(buffer) == 1 and consistent(buffer) == 1
    assert np.array_equal(next(iter(buffer.query())).exp_data.state["screen"], PAGES[0])


def test_rows_written_before_with_arrays_in_their_blob_stay_readable(buffer: ReplayBuffer) -> None:
    """As every row stored before schema revision 0016: the array in the row's blob."""
    row = shots("t", [0])[0]
    buffer.store_batch([row])
    doc, blob = encode_payload({"state": row.exp_data.state}, row.id)
    sql = buffer.sql
    with sql.handle.write() as conn:
        old = conn.execute(select(cast(rows.c.data, Text)).where(rows.c.id == row.id)).scalar_one()
        stored = {**json.loads(old), "state": doc["state"]}
        conn.execute(update(rows).where(rows.c.id == row.id).values(data=stored, tensors=blob))
        conn.execute(array_refs.delete().where(array_refs.c.buffer_id == sql.buffer_id))
        conn.execute(arrays.delete().where(arrays.c.buffer_id == sql.buffer_id))
    back = buffer.get(row.id)
    assert back is not None and np.array_equal(back.exp_data.state["screen"], PAGES[0])
    batch = buffer.sample(converter=NumpyConverter({"s": "exp_data.state.screen"}), batch_size=2)
    assert np.array_equal(batch["s"][0], PAGES[0])


def test_a_damaged_stored_array_fails_its_rows_only(buffer: ReplayBuffer) -> None:
    stored = shots("t", [0, 1])
    buffer.store_batch(stored)
    damaged = array_digest(PAGES[1])
    mine = (arrays.c.digest == damaged, arrays.c.buffer_id == buffer.sql.buffer_id)
    with buffer.sql.handle.write() as conn:
        good = conn.execute(select(arrays.c.data).where(*mine)).scalar_one()
        conn.execute(update(arrays).where(*mine).values(data=bytes(good)[:-100]))
    with pytest.raises(CorruptRowError, match=rf"row {stored[1].id}: state\.screen: .* checksum"):
        buffer.get(stored[1].id)
    readable = buffer.get(stored[0].id)
    assert readable is not None and np.array_equal(readable.exp_data.state["screen"], PAGES[0])
    rewards = buffer.sample(converter=NumpyConverter({"r": "exp_data.reward_t"}), batch_size=4)
    assert set(rewards["r"].tolist()) <= {0.0, 1.0}


def test_a_sample_of_rewards_alone_never_reads_an_array(
    buffer: ReplayBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    buffer.store_batch(shots("t", [0, 1, 2, 3]))
    reads: list[tuple[list[str], int]] = []  # (columns selected, array bytes read)
    original = RowReader.rows_with_arrays

    def counted(self: RowReader, keys: list[int], columns: list, texts_at: list[int]) -> tuple:
        fetched, found = original(self, keys, columns, texts_at)
        names = [getattr(c, "name", str(c)) for c in columns]
        reads.append((names, sum(len(v) for v in found.values())))
        return fetched, found

    monkeypatch.setattr(RowReader, "rows_with_arrays", counted)
    batch = buffer.sample(converter=NumpyConverter({"r": "exp_data.reward_t"}), batch_size=16)
    assert batch["r"].shape == (16,)
    assert reads and all("tensors" not in names and read == 0 for names, read in reads)
    reads.clear()
    shot = buffer.sample(converter=NumpyConverter({"s": "exp_data.state.screen"}), batch_size=16)
    assert shot["s"].shape == (16, 128, 256, 3)
    assert sum(read for _, read in reads) > 0


def test_export_and_import_carry_the_arrays(
    buffer: ReplayBuffer, db_url: str, tmp_path: Path
) -> None:
    buffer.store_batch(shots("t", [0, 0, 1]))
    path = tmp_path / "out.jsonl"
    export_rows(buffer, path)
    assert "digest" not in path.read_text()  # arrays, not references
    with ReplayBuffer(db_url, name=f"{buffer.sql.handle.name}_copy") as copy:
        import_rows(copy, path)
        assert consistent(copy) == 2
        got = {r.exp_meta.step: r.exp_data.state["screen"] for r in copy.query()}
        assert np.array_equal(got[0], PAGES[0]) and np.array_equal(got[2], PAGES[1])


def test_rows_that_share_an_array_get_arrays_of_their_own(buffer: ReplayBuffer) -> None:
    """A batch unpacks a shared array once; rows that may write to it get copies."""
    buffer.store_batch(shots("t", [0, 0, 1, 1]))
    sql = buffer.sql
    with sql.handle.read() as conn:
        keys = list(
            conn.execute(select(rows.c.key).where(rows.c.buffer_id == sql.buffer_id)).scalars()
        )
    _, (screens,) = sql.fetch_columns(keys, ["exp_data.state.screen"])
    pages = [PAGES[p] for p in (0, 0, 1, 1)]
    assert all(np.array_equal(s, p) for s, p in zip(screens, pages, strict=True))
    screens[0][...] = 0
    assert np.array_equal(screens[1], PAGES[0])  # not written through the first


def test_an_image_codec_stores_what_it_cannot_hold_with_zstd(buffer: ReplayBuffer) -> None:
    """Float "images", two channels: silently and losslessly."""
    buffer.set_compression("webp")
    odd = {
        "float": np.random.default_rng(1).random((128, 128, 3)).astype(np.float32),
        "two": np.zeros((256, 256, 2), np.uint8),
    }
    row = make_row("t", "a", 0, state=odd)
    buffer.store_batch([row])
    back = buffer.get(row.id)
    assert back is not None
    for name, array in odd.items():
        assert back.exp_data.state[name].tobytes() == array.tobytes()
    with buffer.sql.handle.read() as conn:
        mine = arrays.c.buffer_id == buffer.sql.buffer_id
        codecs = {
            stored_codec(bytes(d))
            for d in conn.execute(select(arrays.c.data).where(mine)).scalars()
        }
    assert codecs <= {"zstd", "zstd+shuffle"}


def test_large_stored_arrays_are_read_in_pieces(
    buffer: ReplayBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(Postgres sends a bytea as hex text and refuses a value of 1 GB or more.)"""
    from expstore.arrays import stored_once as arrays_feature

    monkeypatch.setattr(arrays_feature, "PIECE", 1000)
    buffer.set_compression(None)
    row = shots("t", [2])[0]
    buffer.store_batch([row])
    back = buffer.get(row.id)
    assert back is not None and np.array_equal(back.exp_data.state["screen"], PAGES[2])


def test_extend_stores_large_array_columns_by_digest(buffer: ReplayBuffer) -> None:
    screens = np.stack([PAGES[0], PAGES[0], PAGES[1]])
    buffer.extend(
        {"task_id": "t", "agent_id": "a", "step": [0, 1, 2], "state": {"screen": screens}}
    )
    assert consistent(buffer) == 2
    got = {r.exp_meta.step: r.exp_data.state["screen"] for r in buffer.query()}
    assert all(np.array_equal(got[i], screens[i]) for i in range(3))


def test_large_torch_tensors_are_stored_by_digest_with_every_bit(buffer: ReplayBuffer) -> None:
    torch = pytest.importorskip("torch")
    tensors = {
        "bf16": torch.randn(256, 256).to(torch.bfloat16),
        "f32": torch.randn(128, 256),
    }
    row = make_row("t", "a", 0, state=dict(tensors))
    buffer.store_batch([row])
    assert consistent(buffer) == 2
    back = buffer.get(row.id)
    assert back is not None
    for name, tensor in tensors.items():
        got = back.exp_data.state[name]
        assert isinstance(got, torch.Tensor) and got.dtype == tensor.dtype
        assert torch.equal(
            got.view(torch.int16) if name == "bf16" else got,
            tensor.view(torch.int16) if name == "bf16" else tensor,
        )


def test_postgres_keeps_stored_arrays_out_of_line_uncompressed(pg_url: str) -> None:
    """STORAGE EXTERNAL: TOAST never tries pglz on bytes that are compressed already."""
    from sqlalchemy import create_engine, text

    with ReplayBuffer(pg_url, name="storage_check"):
        pass
    engine = create_engine(pg_url)
    with engine.connect() as conn:
        storage = conn.execute(
            text(
                "SELECT attstorage FROM pg_attribute WHERE attname = 'data' "
                "AND attrelid = 'expstore_arrays'::regclass"
            )
        ).scalar_one()
    engine.dispose()
    assert storage == "e"
