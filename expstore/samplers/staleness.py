"""StalenessAwareSampler: fresher rows more likely, weight ``1 / (staleness + 1)``, as
TorchRL's ``StalenessAwareSampler``, with the current version shared by every process."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
from typing_extensions import Unpack

from .._args import check_number
from ..query import QueryCondition
from ..storage.base import KeySpace, Storage
from .base import KeySampler, SamplerOptions, with_current_version
from .loop import Choice

__all__ = ["StalenessAwareSampler"]


class StalenessAwareSampler(KeySampler):
    """Rows drawn with probability proportional to ``1 / (staleness + 1) ** power``, with
    replacement.

    ``StalenessAwareSampler(power=1.0, *, max_staleness=None, seed=None, ...)``

    A row's staleness is the buffer's current policy version (set by the trainer with
    :meth:`~expstore.ReplayBuffer.set_policy_version`, the same for every process) minus the
    row's ``policy_version``. Rows without a version, rows of versions newer than the
    current one, and every row while the buffer has no version count as staleness 0 (as
    fresh as can be). With ``max_staleness=k`` rows staler than ``k`` are not drawn at all.
    ``power=1`` gives TorchRL's weight ``1 / (staleness + 1)``; ``power=0`` is uniform.

    >>> sampler = StalenessAwareSampler(max_staleness=4, seed=0)
    """

    columns = ("policy_version",)

    def __init__(self, power: float = 1.0, **options: Unpack[SamplerOptions]) -> None:
        super().__init__(**options)
        self.power = check_number("power", power, minimum=0.0)

    def read_index(self, storage: Storage, query_condition: QueryCondition) -> dict[str, Any]:
        return with_current_version(storage, super().read_index(storage, query_condition))

    def choose_flat(
        self, space: KeySpace, batch_size: int, query_condition: QueryCondition
    ) -> Choice | None:
        # Weights are at most 1 (staleness 0: rows of the current version, newer, or
        # without one): a candidate is kept with its weight, exact rejection; over a key
        # index held in memory, in proportion to it directly.
        current = space.current_version

        def accept(columns: dict[str, np.ndarray]) -> np.ndarray:
            return staleness_weights(columns["policy_version"], current, self.power)

        name = f"staleness:{current}:{self.power!r}"
        return self.choose_rows(
            space,
            batch_size,
            query_condition,
            columns=("policy_version",),
            accept=accept,
            name=name,
        )


def staleness_weights(versions: np.ndarray, current: int | None, power: float) -> np.ndarray:
    """``1 / (staleness + 1) ** power`` per row (staleness 0 for rows without a version,
    newer than ``current``, or when there is no current version)."""
    if current is None:
        return np.ones(len(versions))
    staleness = np.nan_to_num(current - versions, nan=0.0).clip(min=0.0)
    return cast("np.ndarray", (staleness + 1.0) ** -power)
