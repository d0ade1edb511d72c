"""Retention: which rows a buffer keeps. Its capacity and eviction policy and the row
feature that evicts beyond them after every write (capacity), the eviction policies
themselves (eviction), and the tombstone each removed row leaves (tombstones)."""
