"""Claims (claims/: the queue, its reports, group claims), here until they move to a package
of their own; every other feature lives in its concept's package or module over
:mod:`expstore.lifecycle` (retention, arrays, tracking, limits, stats, policy_versions,
group_summaries, priorities, draw_counts, dedup).

Features take a :class:`~expstore.db.handle.BufferHandle` and a connection; the storage
(:mod:`expstore.storage`) composes them into its writes and draws, and the buffer reaches
the ones only SQL keeps through :attr:`expstore.ReplayBuffer.sql`.
"""
