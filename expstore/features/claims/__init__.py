"""Claims: the consume-once queue (queue), its reports and lineage (reports), and claims of
whole groups (groups). The front users hold, :class:`expstore.Claim`, is
:mod:`expstore.claims`."""
