"""GroupSampler: whole groups of rows sharing a key, as GRPO trains on all the rollouts of
one prompt (TorchRL's ``PromptGroupSampler``), with DAPO's filter of groups whose rewards
do not vary, evaluated in the database for every process alike."""

from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple

import numpy as np
from typing_extensions import Unpack

from .._args import check_int
from ..errors import EmptyBufferError, InvalidArgumentError, UnsupportedTypeError
from ..group_summaries import GroupSpec
from ..policy_versions import fresh_mask
from ..query import QueryCondition
from ..query.fields import resolve_field
from ..query.groups import GroupCondition, GroupStat
from ..storage.base import KeySpace, Storage
from .base import KeySampler, SamplerOptions
from .flat import MIN_KEPT
from .index_space import IndexKeySpace
from .loop import Choice, empty_error

__all__ = ["GroupCounts", "GroupOrder", "GroupSampler"]

#: The order a group claim takes ready groups in: oldest first (by first row), or at random.
GroupOrder = Literal["oldest", "random"]


class GroupCounts(NamedTuple):
    """What the groups of the last draw were: ready to draw, and why the others were not."""

    ready: int  # complete, passing the filter, fresh
    waiting: int  # fewer than group_size rows so far
    filtered: int  # complete, but the group condition (e.g. varied reward) failed
    stale: int  # complete and passing, but older than max_staleness


class GroupSampler(KeySampler):
    """Whole groups of ``group_size`` rows that share the value at ``group_by``.

    ``GroupSampler(group_by="task_id", group_size=8, *, varied_reward=False, having=None,
    replacement=False, claim_order="oldest", max_staleness=None, seed=None)``

    - A group is the matching rows with one value at ``group_by`` (a column such as
      ``task_id``, or a payload path such as ``exp_data.ext_info.prompt_id``); its rows are
      its first ``group_size`` by insertion (rows beyond that are never drawn by this
      sampler: write ``group_size`` rows per group). A group with fewer rows is *waiting*
      and is not drawn until it is complete.
    - ``varied_reward=True`` keeps only groups whose ``reward_t`` is not the same in every
      row (std > 0; DAPO's dynamic sampling); ``having`` adds any condition on group
      statistics (:class:`~expstore.query.groups.GroupStat`, e.g.
      ``GroupStat.mean("reward_t") < 0.9``). Both are evaluated by the database.
    - ``max_staleness=k``: a group's version is its *oldest* row's ``policy_version``
      (rows without one are left out of that minimum); groups more than ``k`` versions
      behind the buffer's current version are not drawn.
    - A batch is ``batch_size // group_size`` groups, one after the other (row ``i`` of
      group ``j`` is ``rows[j * group_size + i]``), so ``batch_size`` must be a multiple of
      ``group_size``. Groups are drawn uniformly, distinct within a batch (``replacement=
      False``, the default; a batch asking for more groups than are ready has all of them)
      or independently (``replacement=True``).
    - :attr:`last_counts` says how many groups were ready, waiting, filtered or stale.
    - In a buffer of more than :attr:`summaries_up_to` rows (1M), groups by an indexed
      column (``task_id``, ``agent_id``, ...) are drawn over the key space
      (:meth:`choose_flat`): the process holds nothing that grows with the buffer, and
      only the drawn groups are summarised. Otherwise, and for groups by a payload path or
      a buffer with few ready groups (or fewer than the batch asks for), they are drawn
      over the summaries of every group, which the storage keeps up to date
      incrementally; so is :attr:`last_counts`, counted when read after a draw over the
      key space.

    With claims (``buffer.claim(n, order=GroupSampler(...))``) whole groups are claimed
    at once and consumed once: a group is taken only if all its rows are claimable.
    ``claim_order="oldest"`` (the default) takes the oldest ready groups first (by their
    first row), so groups are trained in the order they completed and few go stale in the
    queue; ``"random"`` takes ready groups at random. Claims read a ready-group index the
    database keeps (see :mod:`expstore.claims.ready_groups`), so a claim costs
    what it takes whatever was consumed before; after a claim, :attr:`last_counts` counts
    the groups of that index: ``ready`` are the groups claimable now (not the ones held by
    claims), ``filtered`` and ``stale`` the groups left out for good
    (consumed ones are not counted).

    >>> sampler = GroupSampler("task_id", group_size=8, varied_reward=True, seed=0)
    """

    whole_units = True

    def __init__(
        self,
        group_by: str = "task_id",
        group_size: int = 8,
        *,
        varied_reward: bool = False,
        having: GroupCondition | None = None,
        replacement: bool = False,
        claim_order: GroupOrder = "oldest",
        **options: Unpack[SamplerOptions],
    ) -> None:
        if options.get("consume_after") is not None:
            raise InvalidArgumentError(
                "GroupSampler does not take consume_after (counting draws row by row would "
                "split groups); consume whole groups once with claims: "
                "buffer.claim(n, order=GroupSampler(...), consumer=...)"
            )
        super().__init__(**options)
        if not isinstance(group_by, str):
            raise UnsupportedTypeError(f"group_by must be a field path string, got {group_by!r}")
        self.group_by = resolve_field(group_by).canonical
        self.group_size = check_int("group_size", group_size, minimum=1)
        if having is not None and not isinstance(having, GroupCondition):
            raise UnsupportedTypeError(
                "having must be a group condition such as GroupStat.mean('reward_t') > 0, "
                f"got {type(having).__name__}"
            )
        if varied_reward:
            varied = GroupStat.spread("reward_t") > 0
            having = varied if having is None else varied & having
        self.having = having
        self.replacement = bool(replacement)
        if claim_order not in ("oldest", "random"):
            raise InvalidArgumentError(
                f'claim_order must be "oldest" or "random", got {claim_order!r}'
            )
        self.claim_order: GroupOrder = claim_order
        self._counts: GroupCounts | None = None
        # After a draw over the key space: where to count the groups if asked.
        self._counts_of: tuple[Storage, QueryCondition] | None = None

    def forget_buffer(self) -> None:
        super().forget_buffer()
        self._counts = self._counts_of = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_counts_of": None}

    @property
    def last_counts(self) -> GroupCounts | None:
        """How many groups were ready, waiting, filtered or stale at the last draw. A draw
        over the key space does not count them: the database counts them when first asked
        for after it (a pass over the matching rows, holding nothing per group here)."""
        counts_of = self._counts_of
        if counts_of is not None:
            self._counts_of = None
            storage, query_condition = counts_of

            def count(space: KeySpace) -> tuple[int, int, int, int]:
                return space.group_counts(self.spec)

            counts = storage.key_space(query_condition, count, max_staleness=self.max_staleness)
            if counts is None:  # a storage without a key space: over its summaries
                counts = count(self.summaries_space(storage, query_condition))
            self._counts = GroupCounts(*counts)
        return self._counts

    @property
    def spec(self) -> GroupSpec:
        return GroupSpec(self.group_by, self.group_size, self.having)

    def summaries_space(self, storage: Storage, query_condition: QueryCondition) -> KeySpace:
        """The summaries of every group the storage keeps (:meth:`Storage.groups`, up to
        date incrementally) as a key space held in memory, whose rows are the groups'
        first rows (:meth:`IndexKeySpace.of_groups
        <expstore.samplers.index_space.IndexKeySpace.of_groups>`)."""
        return IndexKeySpace.of_groups(
            self.spec,
            storage.groups(query_condition, self.spec),
            self._derived_arrays(),
            query_condition=query_condition,
            max_staleness=self.max_staleness,
        )

    def choose(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
    ) -> Choice:
        """:meth:`choose_flat` over the key space (a buffer of more than
        :attr:`summaries_up_to` rows), or over the summaries of every group."""
        if batch_size % self.group_size:
            raise InvalidArgumentError(
                f"GroupSampler(group_size={self.group_size}) returns whole groups, so "
                f"batch_size must be a multiple of {self.group_size}; got {batch_size}"
            )
        flat = self._choose_flat(storage, batch_size, query_condition)
        if flat is not None:
            self._counts, self._counts_of = None, (storage, query_condition)
            return flat
        space = self.summaries_space(storage, query_condition)
        try:
            choice = self.choose_flat(space, batch_size, query_condition)
        except EmptyBufferError as exc:
            raise empty_error(storage, query_condition, str(exc)) from None
        assert choice is not None  # (over every group's summary the draw is exact)
        return choice

    # The probes and the group summaries must see the same rows (a group's first key).
    flat_snapshot = True
    #: Groups are drawn over the summaries of every group while the buffer holds at most
    #: this many rows: kept up to date incrementally, they make warm draws several times
    #: faster than draws over the key space (a few statements each), and build in about a
    #: second per million rows, holding ~60 bytes per row. Above it, over the key space.
    summaries_up_to: int = 1_000_000

    def can_draw_flat(self, query_condition: QueryCondition) -> bool:
        return True

    def choose_flat(
        self, space: KeySpace, batch_size: int, query_condition: QueryCondition
    ) -> Choice | None:
        """Groups drawn by their first rows: matching rows drawn uniformly, kept when they
        are the first row of a ready group (complete, passing, fresh; by
        :meth:`KeySpace.group_summaries <expstore.storage.base.KeySpace.group_summaries>`),
        repeats drawn again without replacement. Every ready group has one first row, so
        the kept ones are uniform draws among the ready groups. Over the database's key
        space by rejection, the group column's index finding the candidates' groups; None
        (the summaries serve) when it has no index, or too few candidates are first rows
        of ready groups (few ready groups, or fewer than the batch asks for without
        replacement). Over the summaries of every group (:meth:`summaries_space`), whose
        rows are the groups' first rows, exactly, among the ready ones, which are counted
        (:attr:`last_counts`) and taken all when the batch asks for more."""
        listed = space.listed is not None
        if batch_size % self.group_size or (not listed and space.rows <= self.summaries_up_to):
            return None  # choose() says why, or the summaries are cheap
        wanted = batch_size // self.group_size
        spec = self.spec
        if listed:
            self.record_counts(GroupCounts(*space.group_counts(spec)))
            ready = self._why_empty_if_none()
            if not self.replacement:
                wanted = min(wanted, ready)
        found: dict[int, np.ndarray] = {}  # the keys of ready groups, by first key

        def firsts(at: dict[str, np.ndarray]) -> np.ndarray:
            groups = space.group_summaries(spec, at["key"])
            if groups is None:  # no index to find a group's rows by: the summaries serve
                return np.zeros(len(at["key"]))
            ready = self._ready(groups, space.current_version)
            if not listed:  # (over the summaries, the groups drawn are looked up once)
                keys = groups["keys"][ready]
                found.update(zip(groups["first"][ready].tolist(), keys, strict=True))
            return np.isin(at["key"], groups["first"][ready]).astype(np.float64)

        name = f"ready groups:{spec.key}:{self.max_staleness}:{space.current_version}"
        picked: list[int] = []
        seen: set[int] = set()
        new_share, drawn_groups = 1.0, 0
        least = MIN_KEPT / self.group_size
        while len(picked) < wanted:
            need = wanted - len(picked)
            # As many as wanted, and more once repeats were drawn (without replacement).
            size = need if new_share >= 1.0 else math.ceil(need / new_share * 1.2) + 4
            drawn = self.draw_rows(
                space,
                size,
                query_condition,
                accept=firsts,
                name=name,
                # Too few first rows of ready groups once enough were tried to tell (8
                # expected at the threshold).
                min_kept=least,
                min_tried=math.ceil(8 / least),
                probe=False,  # (a group's first row is a matching row)
            )
            if drawn is None:
                return None
            new = 0
            for key in drawn.keys.tolist():
                if self.replacement or key not in seen:
                    seen.add(key)
                    new += 1
                    if len(picked) < wanted:
                        picked.append(key)
            new_share = max(new / len(drawn.keys), 1e-3)
            drawn_groups += len(drawn.keys)
            # Many repeats over the database: fewer ready groups than the batch asks for
            # without replacement, or about as many; the summaries count them.
            if not listed and len(picked) < wanted and drawn_groups > 4 * wanted + 16:
                return None
        missing = [key for key in picked if key not in found]
        if missing:
            groups = space.group_summaries(spec, np.array(missing, dtype=np.int64))
            assert groups is not None
            found.update(zip(groups["first"].tolist(), groups["keys"], strict=True))
        keys = np.concatenate([found[key] for key in picked])
        return Choice(keys[keys >= 0])

    def _ready(self, groups: dict[str, Any], current: int | None) -> np.ndarray:
        """Which of these group summaries are ready: complete, passing and fresh."""
        ready: np.ndarray = (groups["size"] == self.group_size) & groups["passes"]
        if self.max_staleness is not None:
            keep = fresh_mask(groups["version"], current, self.max_staleness)
            if keep is not None:
                ready &= keep
        return ready

    def _why_empty_if_none(self) -> int:
        """How many groups :attr:`last_counts` says are ready; EmptyBufferError saying why
        when none is."""
        counts = self._counts
        assert counts is not None
        if counts.ready:
            return counts.ready
        raise EmptyBufferError(
            f"no complete group of {self.group_size} rows by {self.group_by} is ready "
            f"({counts.waiting} waiting for rows, {counts.filtered} filtered out by "
            f"{self.having or 'no condition'}, {counts.stale} older than max_staleness="
            f"{self.max_staleness})"
        )

    def record_counts(self, counts: GroupCounts) -> None:
        """Set :attr:`last_counts`: how a group claim with this order found the groups
        (see :mod:`expstore.claims.group_claims`)."""
        self._counts = counts
        self._counts_of = None

    def claim_staleness(self, max_staleness: int | None) -> int | None:
        """A claim's ``max_staleness`` with this sampler's (the tighter one counts)."""
        limits = [s for s in (self.max_staleness, max_staleness) if s is not None]
        return min(limits) if limits else None
