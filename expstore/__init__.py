"""expstore: a SQL-backed experience store (replay buffer) for training RL and LLM agents."""

import typing as _typing

from .buffer import ReplayBuffer
from .claims import Claim
from .converters import (
    ChatConverter,
    Converter,
    DefaultConverter,
    GroupAdvantageConverter,
    NumpyConverter,
    TensorConverter,
    TrajectoryConverter,
    TransitionConverter,
)
from .errors import (
    ClaimError,
    ClaimFinishedError,
    ClaimOwnerError,
    CodecError,
    ConnectionLostError,
    DuplicateContentError,
    DuplicateIdError,
    EmptyBufferError,
    ExpstoreError,
    InvalidArgumentError,
    LeaseExpiredError,
    MissingDependencyError,
    OutOfRangeError,
    PolicyVersionError,
    QueryError,
    RateLimitedError,
    ReplicaError,
    ReplicaWarning,
    RetentionConflictError,
    RowsEvictedError,
    RowValidationError,
    SchemaVersionError,
    StorageError,
    UnknownConsumerError,
    UnsupportedTypeError,
    WaitTimeoutError,
)
from .features.rate_limiter import RateLimiter, RateLimitStats
from .io import export_rows, import_rows
from .model.rows import DataRow, Experience, ExpMeta
from .query import Condition, QueryBuilder
from .query.groups import GroupCondition, GroupStat
from .samplers import (
    GroupSampler,
    KeySampler,
    LatestSampler,
    PrioritizedSampler,
    RandomTaskSample,
    RandomTaskSampler,
    RecencySampler,
    RewardWeightedSampler,
    Sampler,
    SliceSampler,
    StalenessAwareSampler,
    StratifiedSampler,
    TaskSampler,
    UniformSampler,
)
from .samplers.base import SampleInfo
from .storage import SqlStorage, Storage
from .storage.writer import StoreReport

if _typing.TYPE_CHECKING:
    from .torch_data import ExperienceDataset, SampledBatches

from ._version import __version__

__all__ = [
    "ChatConverter",
    "Claim",
    "ClaimError",
    "ClaimFinishedError",
    "ClaimOwnerError",
    "CodecError",
    "Condition",
    "ConnectionLostError",
    "Converter",
    "DataRow",
    "DefaultConverter",
    "DuplicateContentError",
    "DuplicateIdError",
    "EmptyBufferError",
    "ExpMeta",
    "Experience",
    "ExperienceDataset",
    "ExpstoreError",
    "GroupAdvantageConverter",
    "GroupCondition",
    "GroupSampler",
    "GroupStat",
    "InvalidArgumentError",
    "KeySampler",
    "LatestSampler",
    "LeaseExpiredError",
    "MissingDependencyError",
    "NumpyConverter",
    "OutOfRangeError",
    "PolicyVersionError",
    "PrioritizedSampler",
    "QueryBuilder",
    "QueryError",
    "RandomTaskSample",
    "RandomTaskSampler",
    "RateLimitStats",
    "RateLimitedError",
    "RateLimiter",
    "RecencySampler",
    "ReplayBuffer",
    "ReplicaError",
    "ReplicaWarning",
    "RetentionConflictError",
    "RewardWeightedSampler",
    "RowValidationError",
    "RowsEvictedError",
    "SampleInfo",
    "SampledBatches",
    "Sampler",
    "SchemaVersionError",
    "SliceSampler",
    "SqlStorage",
    "StalenessAwareSampler",
    "Storage",
    "StorageError",
    "StoreReport",
    "StratifiedSampler",
    "TaskSampler",
    "TensorConverter",
    "TrajectoryConverter",
    "TransitionConverter",
    "UniformSampler",
    "UnknownConsumerError",
    "UnsupportedTypeError",
    "WaitTimeoutError",
    "__version__",
    "export_rows",
    "import_rows",
]

_TORCH_NAMES = ("ExperienceDataset", "SampledBatches")


def __getattr__(name: str) -> _typing.Any:
    # The torch datasets subclass torch's classes, so they load torch: only on first use.
    if name in _TORCH_NAMES:
        from . import torch_data

        return getattr(torch_data, name)
    raise AttributeError(f"module 'expstore' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_TORCH_NAMES))
