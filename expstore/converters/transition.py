"""TransitionConverter: DigiRL's transition batch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InvalidArgumentError
from ..model.rows import DataRow
from ..storage.base import Fetched
from .arrays import NumpyConverter
from .base import Converter, FieldSpec
from .tensors import TensorConverter

__all__ = ["TRANSITION_FIELDS", "TransitionConverter"]


def single_action(row: DataRow) -> Any:
    """The row's action: the only element of ``actions``, or the whole list if not one."""
    actions = row.exp_data.actions
    if isinstance(actions, (list, tuple)) and len(actions) == 1:
        return actions[0]
    return actions


#: Where TransitionConverter reads each entry of DigiRL's batch by default.
TRANSITION_FIELDS: dict[str, FieldSpec] = {
    "observation": "exp_data.state.observation",
    "action": single_action,
    "image_features": "exp_data.state.image_features",
    "next_image_features": "exp_data.next_state.image_features",
    "reward": "exp_data.reward_t",
    "next_observation": "exp_data.next_state.observation",
    "done": "exp_data.done",
    "mc_return": "exp_data.ext_info.mc_return",
}


class TransitionConverter(Converter[dict[str, Any]]):
    """DigiRL's batch: ``observation, action, image_features, next_image_features, reward,
    next_observation, done, mc_return``, one entry per row.

    ``TransitionConverter(fields=None, *, device=None, tensors=False)``

    By default the entries are read from (see :data:`TRANSITION_FIELDS`)::

        observation          exp_data.state["observation"]
        action               exp_data.actions[0] (the list itself if it has more or fewer)
        image_features       exp_data.state["image_features"]
        next_image_features  exp_data.next_state["image_features"]
        reward               exp_data.reward_t
        next_observation     exp_data.next_state["observation"]
        done                 exp_data.done
        mc_return            exp_data.ext_info["mc_return"]

    ``fields`` overrides any of them (e.g. ``{"mc_return": "exp_data.v_t"}``). Like DigiRL,
    the batch holds numpy arrays (text as object arrays, features stacked ``[B, D]``);
    ``tensors=True`` gives torch tensors on ``device`` (text as lists). An entry no row
    has comes back as None for every row; features that differ in length are padded, with
    a ``<name>_mask``.

    >>> conv = TransitionConverter(fields={"mc_return": "exp_data.v_t"})
    """

    def __init__(
        self,
        fields: Mapping[str, FieldSpec] | None = None,
        *,
        device: Any = None,
        tensors: bool = False,
    ) -> None:
        unknown = sorted(set(fields or {}) - set(TRANSITION_FIELDS))
        if unknown:
            raise InvalidArgumentError(
                f"TransitionConverter fields are {list(TRANSITION_FIELDS)}; got unknown "
                f"{unknown}. Use TensorConverter or NumpyConverter for other layouts"
            )
        self.fields = {**TRANSITION_FIELDS, **(fields or {})}
        inner: NumpyConverter
        if tensors:
            inner = TensorConverter(self.fields, device, strict=False)
        else:
            if device is not None:
                raise InvalidArgumentError(
                    "device= needs tensors=True (numpy arrays live on the CPU)"
                )
            inner = NumpyConverter(self.fields, strict=False)
        self._inner = inner

    #: The inner converter stacks (copies) every array.
    copies_arrays = True

    @property
    def paths(self) -> list[str] | None:
        return self._inner.paths

    def to_dataset_row(self, rows: Sequence[DataRow]) -> dict[str, Any]:
        return self._inner.to_dataset_row(rows)

    def build(self, fetched: Fetched) -> dict[str, Any]:
        return self._inner.build(fetched)

    def convert_info(self, info: dict[str, Any]) -> dict[str, Any]:
        return self._inner.convert_info(info)
