"""expstore: a SQL-backed experience store (replay buffer) for training RL and LLM agents."""

from .buffer import ReplayBuffer
from .errors import (
    CodecError,
    EmptyBufferError,
    ExpstoreError,
    MissingDependencyError,
    QueryError,
    SchemaVersionError,
    StorageError,
)
from .models import DataRow, Experience, ExpMeta
from .query import Condition, QueryBuilder
from .storage import SqlStorage, Storage

__version__ = "0.1.0"

__all__ = [
    "CodecError",
    "Condition",
    "DataRow",
    "EmptyBufferError",
    "ExpMeta",
    "Experience",
    "ExpstoreError",
    "MissingDependencyError",
    "QueryBuilder",
    "QueryError",
    "ReplayBuffer",
    "SchemaVersionError",
    "SqlStorage",
    "Storage",
    "StorageError",
    "__version__",
]
