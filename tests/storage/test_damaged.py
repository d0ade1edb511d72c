"""Damaged stored rows (edited by hand, a broken disk) raise CodecError naming the row on
every read path, never a raw JSONDecodeError, KeyError, RecursionError or ValueError."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from expstore import CodecError, NumpyConverter, ReplayBuffer, UniformSampler
from expstore.io import export_rows
from expstore.samplers import RewardWeightedSampler, SliceSampler
from tests.helpers import make_rows

_REST = '"actions": [], "messages": null, "next_state": null, "ext_info": {}'
DAMAGES: dict[str, tuple[str, str, bool]] = {  # name: (column, SQL value, SQLite only)
    "document not JSON": ("data", "'not json'", True),
    "document without its fields": ("data", """'{"x": 1}'""", False),
    "document nested 3000 deep": (
        "data",
        '\'{"state": ' + "[" * 3000 + "]" * 3000 + f", {_REST}}}'",
        False,
    ),
    "text in step": ("step", "'abc'", True),
    "text in reward_t": ("reward_t", "'abc'", True),
    "float placeholder holding text": (
        "data",
        f"""'{{"state": {{"__float__": "zzz"}}, {_REST}}}'""",
        False,
    ),
}
READS: dict[str, Callable[[ReplayBuffer, Path, str], Any]] = {
    "get": lambda b, _, victim: b.get(victim),
    "query": lambda b, _, __: list(b.query()),
    "sample rows": lambda b, _, __: [
        b.sample(UniformSampler(seed=s), batch_size=16) for s in range(4)
    ],
    "sample fields": lambda b, _, __: [
        b.sample(
            UniformSampler(seed=s),
            converter=NumpyConverter(
                {"x": "exp_data.state", "step": "exp_meta.step", "r": "exp_data.reward_t"},
                strict=False,
            ),
            batch_size=16,
        )
        for s in range(4)
    ],
    "export": lambda b, tmp, _: export_rows(b, tmp / "out.jsonl"),
}


@pytest.mark.parametrize("read", READS, ids=list(READS))
@pytest.mark.parametrize("damage", DAMAGES, ids=list(DAMAGES))
def test_every_read_path_names_the_damaged_row(
    db_url: str, buffer_name: str, tmp_path: Path, damage: str, read: str
) -> None:
    column, value, sqlite_only = DAMAGES[damage]
    if sqlite_only and not db_url.startswith("sqlite"):
        pytest.skip("Postgres refuses this damage when it is written")
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(make_rows(4))
        victim = [r.id for r in buffer.query()][1]
    engine = create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(
            text(f"UPDATE expstore_rows SET {column} = {value} WHERE id = :i"), {"i": victim}
        )
    engine.dispose()
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        if read in ("get", "query", "export"):  # these read every field of the row
            with pytest.raises(CodecError, match=victim):
                READS[read](buffer, tmp_path, victim)
            return
        try:
            READS[read](buffer, tmp_path, victim)
        except CodecError as exc:
            assert victim in str(exc) or "key" in str(exc)
        # else: the samples never drew the damaged row, or read only intact parts of it


@pytest.mark.parametrize(
    "sampler", [SliceSampler(1), RewardWeightedSampler()], ids=lambda s: type(s).__name__
)
def test_a_sampler_reading_a_damaged_column_says_which_row(tmp_path: Path, sampler: Any) -> None:
    url = f"sqlite:///{tmp_path / 'd.db'}"
    with ReplayBuffer(url) as buffer:
        buffer.store_batch(make_rows(4))
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE expstore_rows SET step = 'x', reward_t = 'y' WHERE key = 2"))
    engine.dispose()
    with ReplayBuffer(url) as buffer, pytest.raises(CodecError, match="the row with key 2 holds"):
        buffer.sample(sampler, batch_size=1)


def test_a_blob_copied_from_another_row_is_detected(db_url: str, buffer_name: str) -> None:
    import numpy as np

    from tests.helpers import make_row

    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(
            [make_row(step=i, state={"obs": np.full(4, float(i))}) for i in range(2)]
        )
        first, second = [r.id for r in buffer.query()]
    engine = create_engine(db_url)
    with engine.begin() as conn:  # the second row's tensor bytes replaced by the first's
        conn.execute(
            text(
                "UPDATE expstore_rows SET tensors = (SELECT tensors FROM expstore_rows "
                "WHERE id = :a) WHERE id = :b"
            ),
            {"a": first, "b": second},
        )
    engine.dispose()
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        assert buffer.get(first) is not None
        with pytest.raises(CodecError, match=rf"row {second}: .*copied from another row"):
            buffer.get(second)
        conv = NumpyConverter({"obs": "exp_data.state.obs"})
        with pytest.raises(CodecError, match="copied from another row"):
            for seed in range(8):
                buffer.sample(UniformSampler(seed=seed), converter=conv, batch_size=4)
