"""expstore under other frameworks' interfaces: each integration a module or package of its
own that imports its framework only there, so ``import expstore`` never needs them.

- :mod:`expstore.integrations.aworld`: AWorld 0.3's ``Storage`` and ``TrajectoryStorage``
  (``pip install 'expstore[aworld]'``).
- :mod:`expstore.integrations.torchrl`: ``ExpstoreStorage``, a TorchRL replay-buffer
  storage whose slots are rows of a buffer (``pip install 'expstore[torchrl]'``).
- :mod:`expstore.integrations.gymnasium`: ``EpisodeRecorder``, a Gymnasium wrapper that
  records an environment's steps as a buffer's episodes (``pip install 'expstore[minari]'``).
"""
