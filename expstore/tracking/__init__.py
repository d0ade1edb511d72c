"""Tracking: the payload paths a buffer tracks, the change flags each write sets on its
rows, and the ``changed()`` condition that reads them (changes)."""
