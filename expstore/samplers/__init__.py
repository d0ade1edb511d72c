"""Samplers choose which rows go into a batch.

:class:`Sampler` is the interface (AWorld's), :class:`KeySampler` the fast path every
built-in sampler takes (choose integer keys over cached numpy arrays, fetch only those
rows), :class:`TaskSampler` chooses whole tasks.
"""

from .base import KeySampler, Sampler, SamplerOptions, TaskSampler
from .group import GroupCounts, GroupSampler
from .latest import LatestSampler
from .prioritized import PrioritizedSampler
from .random_task import RandomTaskSample, RandomTaskSampler
from .recency import RecencySampler
from .reward_weighted import RewardWeightedSampler
from .slice import SliceSampler
from .staleness import StalenessAwareSampler
from .stratified import StratifiedSampler
from .uniform import UniformSampler

__all__ = [
    "GroupCounts",
    "GroupSampler",
    "KeySampler",
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
]
