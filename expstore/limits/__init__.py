"""Limits: how fast rows may be written and drawn. The rate limiter's rule, Reverb's
samples per insert with its error bounds (rate_limiter: :class:`expstore.RateLimiter`),
and the buffer's limit in the database: its settings, the samples counted under it, the
discarded rows it no longer counts, and the writers it holds back (counters)."""
