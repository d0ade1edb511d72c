"""expstore under other frameworks' interfaces: each integration a package of its own that
imports its framework only there, so ``import expstore`` never needs them.

- :mod:`expstore.integrations.aworld`: AWorld 0.3's ``Storage`` and ``TrajectoryStorage``
  (``pip install 'expstore[aworld]'``).
"""
