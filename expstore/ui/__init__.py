"""The trajectory viewer: ``expstore ui``, a local web page to look at what agents did and
what learners consumed (buffers, rows, trajectories with their screenshots, GRPO groups,
live state). Read-only unless told otherwise; needs ``pip install 'expstore[ui]'``.

- :mod:`expstore.ui.reads`: what each page shows, read from the database;
- :mod:`expstore.ui.media`: images as PNG and thumbnails, other values as text;
- :mod:`expstore.ui.charts`: the live page's SVG charts;
- :mod:`expstore.ui.app`: the Starlette app (routes, errors, headers).
"""

from __future__ import annotations

from .app import LOOPBACK_HOSTS, buffer_segment, make_app

__all__ = ["LOOPBACK_HOSTS", "buffer_segment", "make_app"]
