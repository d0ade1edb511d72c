"""Storage: where rows live (see :class:`SqlStorage`) and the interface it implements."""

from ..db.tuning import Tuning
from .base import Storage
from .sql import SqlStorage, create_sql_engine, describe_database

__all__ = ["SqlStorage", "Storage", "Tuning", "create_sql_engine", "describe_database"]
