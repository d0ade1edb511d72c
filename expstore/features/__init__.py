"""What a buffer keeps beside its rows, each in its own tables with its own statements: the
buffer's row and retention (registry, eviction), the state read with every draw (state),
policy versions and freshness (versions), priorities, draw counts (``consume_after``), rate
limits (rate_limiter: the rule; rate_limits: its counters), dedup, group summaries
(groups), claims (claims/: the queue, its reports, group claims) and statistics (stats/).

Features take a :class:`~expstore.db.handle.BufferHandle` and a connection; the storage
(:mod:`expstore.storage`) composes them into its writes and draws, and the buffer reaches
the ones only SQL keeps through :attr:`expstore.ReplayBuffer.sql`.
"""
