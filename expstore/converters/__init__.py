"""Converters turn the rows a sampler chose into a training batch.

:class:`Converter` is the interface (AWorld's ``to_dataset_row(rows)``). Importing this
package does not import torch; :class:`TensorConverter` imports it when created, and
:class:`ImageConverter` imports torch or Pillow when created for an output that needs them.
"""

from .advantage import GroupAdvantageConverter, group_advantages
from .arrays import NumpyConverter
from .base import Converter
from .chat import ChatConverter
from .default import DefaultConverter
from .images import ImageConverter
from .tensors import TensorConverter
from .trajectory import TrajectoryConverter
from .transition import TransitionConverter

__all__ = [
    "GroupAdvantageConverter",
    "group_advantages",
    "ChatConverter",
    "Converter",
    "DefaultConverter",
    "ImageConverter",
    "NumpyConverter",
    "TensorConverter",
    "TrajectoryConverter",
    "TransitionConverter",
]
