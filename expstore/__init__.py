"""expstore: a SQL-backed experience store (replay buffer) for training RL and LLM agents."""

import typing as _typing

from .buffer import ReplayBuffer
from .claims import Claim, Consumer, Step
from .claims.prompts import AdmissionState
from .converters import (
    ChatConverter,
    Converter,
    DefaultConverter,
    GroupAdvantageConverter,
    ImageConverter,
    NumpyConverter,
    TensorConverter,
    TrajectoryConverter,
    TransitionConverter,
)
from .errors import (
    AdmissionTimeoutError,
    ClaimError,
    ClaimFinishedError,
    ClaimOwnerError,
    CodecError,
    ConnectionLostError,
    CorruptRowError,
    DuplicateContentError,
    DuplicateIdError,
    EmptyBufferError,
    ExpstoreError,
    FencedError,
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
from .io import export_images, export_rows, import_rows
from .limits.rate_limiter import RateLimiter, RateLimitStats
from .minari_io import export_minari, import_minari
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
from .samplers.loop import SampleInfo
from .storage import SqlStorage, Storage
from .storage.writer import StoreReport

if _typing.TYPE_CHECKING:
    from .torch_data import ExperienceDataset, SampledBatches

from ._version import __version__

__all__ = [
    "AdmissionState",
    "AdmissionTimeoutError",
    "ChatConverter",
    "Claim",
    "ClaimError",
    "ClaimFinishedError",
    "ClaimOwnerError",
    "CodecError",
    "Condition",
    "ConnectionLostError",
    "Consumer",
    "Converter",
    "CorruptRowError",
    "DataRow",
    "DefaultConverter",
    "DuplicateContentError",
    "DuplicateIdError",
    "EmptyBufferError",
    "ExpMeta",
    "Experience",
    "ExperienceDataset",
    "ExpstoreError",
    "FencedError",
    "GroupAdvantageConverter",
    "GroupCondition",
    "GroupSampler",
    "GroupStat",
    "ImageConverter",
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
    "Step",
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
    "export_images",
    "export_minari",
    "export_rows",
    "import_minari",
    "import_rows",
]

_TORCH_NAMES = ("ExperienceDataset", "SampledBatches")


def __getattr__(name: str) -> _typing.Any:
    # The torch datasets subclass torch's classes, so they load torch: only on first use.
    if name in _TORCH_NAMES:
        try:
            from . import torch_data
        except MissingDependencyError as missing:
            return _needs_torch(name, str(missing))
        return getattr(torch_data, name)
    raise AttributeError(f"module 'expstore' has no attribute {name!r}")


def _needs_torch(name: str, message: str) -> type:
    """Stands for a torch dataset where torch is not installed, so that ``from expstore
    import *`` works with the core install alone: using it raises the
    MissingDependencyError that names the extra to install."""

    def refuse(*args: _typing.Any, **kwargs: _typing.Any) -> _typing.NoReturn:
        raise MissingDependencyError(message)

    return type(
        name,
        (),
        {
            "__doc__": f"{name} needs torch, which is not installed: {message}",
            "__module__": __name__,
            "__init__": refuse,
            "__init_subclass__": classmethod(refuse),
        },
    )


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_TORCH_NAMES))
