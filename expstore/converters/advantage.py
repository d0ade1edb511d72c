"""GroupAdvantageConverter: group-normalised advantages (GRPO), per row of a batch.

Wraps any converter. The rows of a batch that share the value at ``group_by`` (all the
rollouts of one prompt, as :class:`~expstore.samplers.GroupSampler` and group claims
return them) form a group; each row's advantage is ``(r - mean) / (std + eps)`` over its
group's rewards (``scale=None``: ``r - mean``, Dr. GRPO's unscaled form). A dict batch
gains ``"advantages"`` (float32; a torch tensor when the batch holds tensors); a batch of
rows gets each row's ``exp_data.adv_t`` set (rows are fresh copies, the store is not
changed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, cast

import numpy as np

from .._args import check_int, check_number
from .._optional import loaded_torch
from ..errors import InvalidArgumentError, UnsupportedTypeError
from ..model.paths import MISSING, parse_path, read_path
from ..model.rows import DataRow
from ..samplers.loop import SampleInfo
from ..storage.base import Fetched
from .base import Converter, as_converter
from .default import DefaultConverter

__all__ = ["GroupAdvantageConverter", "group_advantages"]


def group_advantages(
    groups: Sequence[Any],
    rewards: Sequence[Any] | np.ndarray,
    *,
    eps: float = 1e-6,
    scale: Literal["std"] | None = "std",
    ddof: int = 1,
) -> np.ndarray:
    """``(r - mean) / (std + eps)`` per row over the rows sharing its group value (float32).

    ``ddof=1`` (the default) is the sample std that ``torch.std`` and TRL use; a group of
    one row has advantage 0."""
    values = np.asarray([np.nan if r is None or r is MISSING else r for r in rewards], float)
    if np.isnan(values).any():
        at = int(np.flatnonzero(np.isnan(values))[0])
        raise InvalidArgumentError(
            f"row {at} of the batch has no reward, so its group advantage is undefined; "
            "store reward_t for every rollout (or filter rows without one)"
        )
    codes = np.unique(np.asarray([repr(g) for g in groups], dtype=object), return_inverse=True)[1]
    counts = np.bincount(codes).astype(float)
    mean = np.bincount(codes, values) / counts
    centred = values - mean[codes]
    if scale is None:
        return cast("np.ndarray", centred.astype(np.float32))
    squares = np.bincount(codes, centred**2)
    dof = np.maximum(counts - ddof, 1.0)
    std = np.sqrt(squares / dof)
    std[counts <= ddof] = 0.0
    return cast("np.ndarray", (centred / (std[codes] + eps)).astype(np.float32))


class GroupAdvantageConverter(Converter[Any]):
    """``inner``'s batch with group-normalised advantages.

    ``GroupAdvantageConverter(inner=None, *, group_by="task_id", reward="exp_data.reward_t",
    eps=1e-6, scale="std", ddof=1, name="advantages")``

    >>> conv = GroupAdvantageConverter(group_by="task_id")  # rows, each with adv_t set
    """

    def __init__(
        self,
        inner: Converter[Any] | None = None,
        *,
        group_by: str = "task_id",
        reward: str = "exp_data.reward_t",
        eps: float = 1e-6,
        scale: Literal["std"] | None = "std",
        ddof: int = 1,
        name: str = "advantages",
    ) -> None:
        self.inner = as_converter(DefaultConverter() if inner is None else inner)
        self.group_by = parse_path(group_by).canonical
        self.reward = parse_path(reward).canonical
        self.eps = check_number("eps", eps, minimum=0.0)
        if scale not in ("std", None):
            raise InvalidArgumentError(f'scale must be "std" or None, got {scale!r}')
        self.scale = scale
        self.ddof = check_int("ddof", ddof, minimum=0)
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"name must be a non-empty string, got {name!r}")
        self.name = name

    @property
    def copies_arrays(self) -> bool:  # type: ignore[override]
        return self.inner.copies_arrays

    @property
    def paths(self) -> list[str] | None:
        inner = self.inner.paths
        return None if inner is None else [*inner, self.group_by, self.reward]

    def _advantages(self, groups: Sequence[Any], rewards: Sequence[Any]) -> np.ndarray:
        return group_advantages(groups, rewards, eps=self.eps, scale=self.scale, ddof=self.ddof)

    def to_dataset_row(self, rows: Sequence[DataRow]) -> Any:
        advantages = self._advantages(
            [read_path(r, self.group_by) for r in rows], [read_path(r, self.reward) for r in rows]
        )
        return self._with(self.inner.to_dataset_row(rows), advantages)

    def build(self, fetched: Fetched) -> Any:
        if fetched.rows is not None:
            return self.to_dataset_row(fetched.rows)
        assert fetched.columns is not None
        *inner, groups, rewards = fetched.columns
        advantages = self._advantages(list(groups), list(rewards))
        return self._with(self.inner.build(fetched._replace(columns=inner)), advantages)

    def _with(self, batch: Any, advantages: np.ndarray) -> Any:
        if isinstance(batch, dict):
            if self.name in batch:
                raise InvalidArgumentError(
                    f"the inner converter already produces {self.name!r}; give "
                    "GroupAdvantageConverter(name=...) another name"
                )
            torch = loaded_torch()
            if torch is not None and any(isinstance(v, torch.Tensor) for v in batch.values()):
                batch[self.name] = torch.from_numpy(advantages)
            else:
                batch[self.name] = advantages
            return batch
        if isinstance(batch, list) and all(isinstance(r, DataRow) for r in batch):
            for row, value in zip(batch, advantages.tolist(), strict=True):
                row.exp_data.adv_t = value
            return batch
        raise UnsupportedTypeError(
            "GroupAdvantageConverter adds advantages to a dict batch or sets adv_t on a list "
            f"of rows; the inner converter built a {type(batch).__name__}"
        )

    def attach_info(self, batch: Any, info: SampleInfo) -> Any:
        return self.inner.attach_info(batch, info)
