"""expstore under AWorld 0.3 (``pip install 'expstore[aworld]'``): its ``Storage`` and its
``TrajectoryStorage`` on an expstore buffer, SQLite or Postgres.

- :class:`ExpstoreStorage`: AWorld's ``Storage`` (blocks of data items, condition dicts run
  as SQL); see :mod:`expstore.integrations.aworld.storage`.
- :class:`ExpstoreTrajectoryStorage`: a ``TrajectoryStorage`` made with no arguments
  (``TaskConfig(trajectory_storage=ExpstoreTrajectoryStorage)``), each step an ordinary
  expstore row; see :mod:`expstore.integrations.aworld.trajectory` and, for the row's
  fields, :mod:`expstore.integrations.aworld.rows`.
- :func:`compile_condition`: AWorld's conditions as expstore conditions
  (:mod:`expstore.integrations.aworld.conditions`).

Importing this package imports AWorld; without it installed (or with AWorld before 0.2.8,
which has no ``aworld.core.storage``) it raises
:class:`~expstore.errors.MissingDependencyError`, saying what to install.
"""

from __future__ import annotations

from ..._optional import require

require("aworld.core.storage.base", "expstore.integrations.aworld (AWorld 0.3's Storage)")

from .conditions import compile_condition  # noqa: E402
from .rows import ItemLayout, TrajectoryLayout  # noqa: E402
from .storage import ExpstoreStorage, ExpstoreStorageConfig  # noqa: E402
from .trajectory import ExpstoreTrajectoryStorage  # noqa: E402

__all__ = [
    "ExpstoreStorage",
    "ExpstoreStorageConfig",
    "ExpstoreTrajectoryStorage",
    "ItemLayout",
    "TrajectoryLayout",
    "compile_condition",
]
