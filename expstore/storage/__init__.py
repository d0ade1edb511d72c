"""Storage: where rows live (see :class:`SqlStorage`) and the interface it implements."""

from .base import Storage
from .sql import SqlStorage, create_sql_engine, describe_database

__all__ = ["SqlStorage", "Storage", "create_sql_engine", "describe_database"]
