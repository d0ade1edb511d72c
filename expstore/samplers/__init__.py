"""Samplers choose which rows go into a batch.

:class:`Sampler` is the interface (AWorld's), :class:`KeySampler` the fast path every
built-in sampler takes (choose integer keys over cached numpy arrays, fetch only those
rows), :class:`TaskSampler` chooses whole tasks.

A sampler of your own subclasses :class:`KeySampler` and implements one method,
``choose_flat(space, batch_size, condition)``, against a :class:`KeySpace` (the database's
key primitives, or the key index held in memory when probing does not pay), with
:func:`draw_uniform` to draw; it returns a :class:`Choice`. See
``examples/long_messages_sampler.py``.
"""

from ..storage.base import KeySpace
from .base import KeySampler, Sampler, SamplerOptions, TaskSampler
from .flat import Drawn, draw_uniform
from .group import GroupCounts, GroupSampler
from .latest import LatestSampler
from .loop import Choice
from .prioritized import PrioritizedSampler
from .random_task import RandomTaskSample, RandomTaskSampler
from .recency import RecencySampler
from .reward_weighted import RewardWeightedSampler
from .slice import SliceSampler
from .staleness import StalenessAwareSampler
from .stratified import StratifiedSampler
from .uniform import UniformSampler

__all__ = [
    "Choice",
    "Drawn",
    "GroupCounts",
    "GroupSampler",
    "KeySampler",
    "KeySpace",
    "LatestSampler",
    "PrioritizedSampler",
    "RandomTaskSample",
    "RandomTaskSampler",
    "RecencySampler",
    "RewardWeightedSampler",
    "Sampler",
    "SamplerOptions",
    "SliceSampler",
    "StalenessAwareSampler",
    "StratifiedSampler",
    "TaskSampler",
    "UniformSampler",
    "draw_uniform",
]
