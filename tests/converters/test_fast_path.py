"""buffer.sample with a path-only converter fetches just those fields, and gives exactly
the batch that converting whole rows gives."""

from __future__ import annotations

import numpy as np
import pytest

from expstore import (
    DataRow,
    Experience,
    ExpMeta,
    NumpyConverter,
    PrioritizedSampler,
    QueryBuilder,
    ReplayBuffer,
    UniformSampler,
)

FIELDS = {
    "obs": "exp_data.state.obs",
    "ragged": "exp_data.state.ragged",
    "step": "exp_meta.step",
    "reward": "exp_data.reward_t",
    "first_action": "exp_data.actions.0.x",
    "url": "exp_data.state.url",
    "nan": "exp_data.ext_info.nan",
    "maybe": "exp_data.ext_info.only_even",
    "id": "id",
}


def _rows(n: int) -> list[DataRow]:
    rows = []
    for i in range(n):
        ext = {"nan": float("nan") if i % 3 == 0 else float(i)}
        if i % 2 == 0:
            ext["only_even"] = i
        rows.append(
            DataRow(
                exp_meta=ExpMeta(task_id=f"t{i % 5}", agent_id=f"a{i % 2}", step=i),
                exp_data=Experience(
                    state={
                        "obs": np.full((2, 3), i, dtype=np.float32),
                        "ragged": np.arange(i % 4, dtype=np.int64),
                        "url": f"u{i}",
                    },
                    actions=[{"x": i * 10}],
                    reward_t=float(i) if i % 4 else None,
                    ext_info=ext,
                ),
            )
        )
    return rows


class _RowsOnly(NumpyConverter):
    """The same converter with the fast path switched off."""

    @property
    def field_paths(self) -> None:  # type: ignore[override]
        return None


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        x, y = a[name], b[name]
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape, name
            assert x.tobytes() == y.tobytes() or x.tolist() == y.tolist(), name
        else:
            assert x == y, name


@pytest.mark.parametrize(
    "make_sampler", [lambda: UniformSampler(seed=3), lambda: PrioritizedSampler(seed=3)]
)
def test_fast_path_batch_equals_whole_row_batch(
    db_url: str, buffer_name: str, make_sampler
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buf:
        buf.store_batch(_rows(40))
        cond = QueryBuilder().ne("exp_meta.task_id", "t0").build()
        fast = buf.sample(make_sampler(), cond, NumpyConverter(FIELDS), batch_size=64)
        slow = buf.sample(make_sampler(), cond, _RowsOnly(FIELDS), batch_size=64)
        _same(fast, slow)
        assert fast["obs"].shape == (64, 2, 3)
        assert "ragged_mask" in fast
        assert fast["url"].dtype == object
        assert all(int(s) % 5 != 0 for s in fast["step"])


def test_fast_path_keeps_strict_errors(tmp_path) -> None:
    with ReplayBuffer(f"sqlite:///{tmp_path / 'x.db'}") as buf:
        buf.store_batch(_rows(4))
        with pytest.raises(ValueError, match="no row of the batch has field 'typo'"):
            buf.sample(UniformSampler(seed=0), None, NumpyConverter({"typo": "state.nope"}), 8)
