"""The row lifecycle every feature builds on: the hooks a feature joins and their contexts
(hooks: :class:`~expstore.lifecycle.hooks.RowFeature`, its registration, the write's
:class:`~expstore.lifecycle.hooks.BufferState`), each buffer's row and the removal of its
rows (registry), and the buffer's state as a reader sees it (reader_state)."""
