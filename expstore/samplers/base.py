"""The sampler interfaces: a sampler chooses rows; the storage fetches them and a converter
builds the batch, in the one loop, :func:`draw` (below).

- :class:`KeySampler` is what every built-in sampler is. It chooses integer keys of the
  matching rows; only the chosen rows are fetched, by primary key (the table is never
  scanned or ``ORDER BY random()``-ed per batch). A sampler of one's own implements one
  method, :meth:`KeySampler.choose_flat`, against a
  :class:`~expstore.storage.base.KeySpace` (the database's key primitives, or the key index
  held in memory when probing does not pay: the loop runs the same method over it), and
  says which columns it reads in ``columns``::

      import numpy as np
      from expstore.samplers import KeySampler

      class HighRewardSampler(KeySampler):
          \"\"\"Uniform over the rows whose reward is at least ``threshold``.\"\"\"

          columns = ("reward_t",)

          def __init__(self, threshold: float, **options) -> None:
              super().__init__(**options)
              self.threshold = threshold

          def choose_flat(self, space, batch_size, query_condition):
              def accept(c):
                  return (np.nan_to_num(c["reward_t"], nan=-np.inf) >= self.threshold) * 1.0

              return self.choose_rows(space, batch_size, query_condition,
                                      columns=self.columns, accept=accept,
                                      name=f"high:{self.threshold}")

      rows = buffer.sample(HighRewardSampler(0.5, seed=0), batch_size=32)

  :meth:`KeySampler.choose_rows` is :func:`~expstore.samplers.flat.draw_uniform` with the
  sampler's stream, probe budget and kept hint. A sampler that weighs its rows (importance
  weights) sets ``weighs_rows`` and returns them with its keys (``drawn_weights``, as
  :class:`~expstore.samplers.prioritized.PrioritizedSampler`). A sampler may instead
  override :meth:`KeySampler.sample_keys`, a draw over the key index's arrays alone (and
  :meth:`KeySampler.weights` if it weighs its rows).
- :class:`TaskSampler` chooses whole tasks (trajectories), as AWorld's ``TaskSampler``.
- :class:`Sampler` is AWorld's interface: ``sample(storage, batch_size, query_condition=None)``
  returns a list of :class:`~expstore.model.rows.DataRow`. A subclass that implements only
  ``sample`` (and any object with such a method, as AWorld's own samplers) works in
  :meth:`ReplayBuffer.sample <expstore.ReplayBuffer.sample>` too: its rows go to the converter.

Every built-in sampler takes ``seed=``: ``np.random.default_rng(seed)`` drives all its draws, so
the same seed over the same data gives the same batches.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypedDict, TypeVar, cast

import numpy as np
from typing_extensions import Unpack

from .._args import check_int, check_staleness, seeded_rng
from ..errors import EmptyBufferError, UnsupportedTypeError
from ..model.rows import DataRow
from ..policy_versions import fresh_mask
from ..query import Condition, QueryCondition
from ..storage.base import KeySpace, Storage
from .flat import PROBE_BUDGET, Drawn, DrawOptions, draw_uniform
from .index_space import IndexKeySpace
from .loop import Choice, SampleInfo, describe_condition, draw, draw_tasks, empty_error
from .state import (
    NO_KEYS,
    DerivedArrays,
    KeyState,
    masked,
    numbering,
    same_arrays,
    value_codes,
    whole_index,
)

__all__ = [
    "KeySampler",
    "Sampler",
    "SamplerOptions",
    "TaskSampler",
    "as_sampler",
    "with_current_version",
]

_T = TypeVar("_T")

#: Calls under a condition that go straight to the key index after a flat draw gave up.
_FLAT_SKIPS = 64


class Sampler(ABC):
    """Chooses rows from a storage (AWorld's interface).

    Implement :meth:`sample`, or, to take part in the sampling loop, :meth:`choose`
    (:class:`KeySampler` and :class:`TaskSampler` do). After each batch drawn through the
    loop, :attr:`last_info` describes it.
    """

    #: Whether batches carry importance weights that must stay aligned with their rows.
    weighs_rows: ClassVar[bool] = False
    #: Whether a batch is whole units (windows, groups) laid out one after the other, which
    #: a row missing from the fetch would break: such a batch is never returned short.
    whole_units: ClassVar[bool] = False
    #: What the last batch drawn through the loop was (keys, ids, weights).
    last_info: SampleInfo | None = None
    #: Draws after which a row leaves this sampler, counted in the database across every
    #: process (None: rows are drawn forever). Key samplers take it as an option
    #: (:class:`SamplerOptions`); the loop counts the draws (:func:`draw`).
    consume_after: int | None = None
    #: Which buffer this sampler last drew from (:attr:`Storage.identity`; see
    #: :meth:`on_buffer`).
    _buffer_seen: tuple[Any, ...] | None = None
    _derived: DerivedArrays | None = None

    def _derived_arrays(self) -> DerivedArrays:
        """Values this sampler derived from key-index arrays (see :class:`DerivedArrays`)."""
        cache = self._derived
        if cache is None:
            cache = self._derived = DerivedArrays()
        return cache

    @abstractmethod
    def sample(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
    ) -> list[DataRow]:
        """Up to ``batch_size`` rows among those matching ``query_condition``."""

    # -- the buffer a sampler's state belongs to ------------------------------------------
    # A sampler holds things of the buffer it draws from (an epoch's progress, the rows it
    # knows spent, the groups it saw taken) and forgets them when it is next used with
    # another buffer, or with its buffer made anew (see :attr:`Storage.identity`).
    def on_buffer(self, storage: Storage) -> bool:
        """Called before each draw and after its choice: forget what this sampler holds
        of the buffer it drew from last (:meth:`forget_buffer`) when ``storage`` reads
        another one, or the same one made anew (see :attr:`Storage.identity`); whether
        it did."""
        now = storage.identity
        seen = self._buffer_seen
        self._buffer_seen = now
        if seen is None or _same_buffer(seen, now):
            return False
        self.forget_buffer()
        return True

    def forget_buffer(self) -> None:  # noqa: B027 - a hook samplers with state fill
        """Forget what this sampler holds of the buffer it drew from (an epoch's progress,
        rows known spent, groups seen taken): it draws from another one now. The random
        stream goes on."""

    # -- consume_after: the loop's calls ---------------------------------------------------
    def spent_keys(self) -> np.ndarray:
        """The keys this sampler knows spent (drawn ``consume_after`` times by every
        process together), sorted; the loop does not ask the database to count them again.
        None known here; :class:`KeySampler` keeps them."""
        return NO_KEYS

    def spend(self, keys: np.ndarray) -> None:  # noqa: B027 - key samplers keep them
        """Leave out ``keys``: the database refused them another draw (consume_after)."""

    @property
    def last_keys(self) -> np.ndarray:
        """The keys chosen for the last batch, in batch order."""
        return NO_KEYS if self.last_info is None else self.last_info.keys

    @property
    def last_ids(self) -> list[str]:
        """The ids of the rows of the last batch, in batch order."""
        return [] if self.last_info is None else self.last_info.ids

    def choose(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
    ) -> Choice:
        """What to fetch for a batch. By default the rows :meth:`sample` returns (the
        AWorld way); KeySampler and TaskSampler choose keys instead."""
        return Choice(NO_KEYS, rows=self.sample(storage, batch_size, query_condition))

    def mark(self) -> Any:
        """What choosing a batch again must start from (a sampler whose choices move it
        along, such as an epoch, returns where it stands; others None)."""
        return None

    def rewind(self, mark: Any) -> None:  # noqa: B027 - a hook most samplers need not fill
        """Go back to ``mark`` (from :meth:`mark`): the batch is being chosen again."""

    def weights_of(self, choice: Choice) -> np.ndarray | None:
        """The importance weights of ``choice``'s keys (None: this sampler weighs none)."""
        return None

    def describe(self, choice: Choice, ids: list[str]) -> SampleInfo:
        """The :class:`SampleInfo` of a batch of ``choice`` whose rows ``ids`` were fetched
        (kept as :attr:`last_info`)."""
        info = SampleInfo(choice.keys, ids)
        self.last_info = info
        return info

    def sample_with_info(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
    ) -> tuple[list[DataRow], dict[str, Any]]:
        """The rows and the batch's extras as a dict (``{}``, or ``weights`` and ``ids``
        from a sampler that weighs rows)."""
        fetched, info = draw(storage, self, batch_size, query_condition)
        assert fetched.rows is not None
        return fetched.rows, info.extras()

    def reseed(self, seed: Any) -> None:
        """Restart the sampler's random stream from ``seed`` (and forget any epoch state).

        :class:`~expstore.torch_data.SampledBatches` calls this in each DataLoader worker.
        This default restarts every ``numpy.random.Generator`` and ``random.Random`` the
        sampler holds as an attribute, each from its own child of ``seed``, so a custom
        sampler that keeps one gets a stream of its own in each worker (the module-level
        ``random`` and ``np.random`` streams torch already seeds per worker). Override it
        to reset other state.
        """
        sequence = (
            seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
        )
        for name, value in sorted(vars(self).items()):
            if isinstance(value, np.random.Generator):
                setattr(self, name, np.random.default_rng(sequence.spawn(1)[0]))
            elif isinstance(value, random.Random):
                value.seed(int(sequence.spawn(1)[0].generate_state(1, np.uint64)[0]))


def _same_buffer(seen: tuple[Any, ...], now: tuple[Any, ...]) -> bool:
    """Whether two :attr:`Storage.identity` values name one buffer (an incarnation not
    known on either side counts as the same)."""
    if seen[:-1] != now[:-1]:
        return False
    return seen[-1] is None or now[-1] is None or seen[-1] == now[-1]


class _ForeignSampler(Sampler):
    """An object with AWorld's ``sample(storage, batch_size, query_condition)`` that is not
    an expstore Sampler (AWorld's own samplers): its rows go through the loop as they are.
    AWorld's task samplers return ``{task_id: rows}``: their rows come task by task."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler

    def sample(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
    ) -> list[DataRow]:
        drawn = self.sampler.sample(storage, batch_size, query_condition)
        if isinstance(drawn, Mapping):
            return [row for rows in drawn.values() for row in rows]
        return list(drawn)


def as_sampler(sampler: Any) -> Sampler:
    """``sampler`` as a :class:`Sampler`: itself, or an object with AWorld's ``sample()``
    method wrapped; UnsupportedTypeError for anything else."""
    if isinstance(sampler, Sampler):
        return sampler
    if callable(getattr(sampler, "sample", None)):
        return _ForeignSampler(sampler)
    raise UnsupportedTypeError(
        f"a sampler is a Sampler (UniformSampler(), PrioritizedSampler()...) or has a "
        f"sample(storage, batch_size, query_condition) method; got {type(sampler).__name__}"
    )


class SamplerOptions(TypedDict, total=False):
    """What every key sampler takes besides its own parameters (keyword only)."""

    #: Seeds ``np.random.default_rng``: the same seed over the same data, the same batches.
    seed: int | None
    #: A row leaves the sampler once drawn this many times, counted across processes.
    consume_after: int | None
    #: Rows more than this many policy versions behind the buffer's current one are not
    #: drawn (rows without a version always are).
    max_staleness: int | None


class KeySampler(Sampler):
    """A sampler that chooses integer keys over the storage's cached key index.

    Subclasses implement :meth:`choose_flat` (or :meth:`sample_keys`, over the key index
    alone) and list the columns they read in ``columns`` (``step``, ``task_id``,
    ``agent_id``, ``reward_t``, ``done``, ``priority``, any column or a path into the
    payload). One that weighs its rows implements
    :meth:`weights` too.

    After each batch, ``last_keys`` holds the chosen keys and ``last_ids`` the ids of the
    rows returned, in batch order (``last_info`` both, and the weights).

    Every key sampler takes the :class:`SamplerOptions`: ``seed=``; ``consume_after=k``,
    with which a row leaves the sampler once it has been drawn k times, counted in the
    database across every process (see :func:`draw`); and
    ``max_staleness=k``, with which rows whose ``policy_version`` is more than k behind the
    buffer's current version (:meth:`~expstore.ReplayBuffer.set_policy_version`) are not
    drawn; rows without a version always are (see :mod:`expstore.policy_versions`).
    """

    #: The key_index columns :meth:`sample_keys` reads, besides ``"key"``.
    columns: ClassVar[tuple[str, ...]] = ()
    #: Whether to draw over the key space when :meth:`choose_flat` can (False: always over
    #: the key index, e.g. to compare the two).
    flat: bool = True
    #: Whether a flat draw's statements must read one snapshot (a transaction's cost): a
    #: draw whose first statements bound what later ones find (priority bounds, probes).
    flat_snapshot: ClassVar[bool] = False
    #: Candidate keys a draw over the key space probes at most (or so many per row asked,
    #: if more) before the key index serves instead; a knob for tests and measurements
    #: (``sampler.probe_budget = 64``).
    probe_budget: int = PROBE_BUDGET

    # Set in __init__; declared here too, so a subclass that forgot to call
    # ``super().__init__`` still draws (with no options and a random stream of its own).
    seed: Any = None
    #: Rows more than this many policy versions behind the buffer's current version are
    #: not drawn (None: no limit); see :mod:`expstore.policy_versions`.
    max_staleness: int | None = None
    _rng: np.random.Generator | None = None
    _derived: DerivedArrays | None = None
    _key_state: KeyState | None = None

    def __init__(self, **options: Unpack[SamplerOptions]) -> None:
        unknown = set(options) - set(SamplerOptions.__annotations__)
        if unknown:
            raise UnsupportedTypeError(
                f"{type(self).__name__} got unknown options {sorted(unknown)}; every key "
                f"sampler takes {sorted(SamplerOptions.__annotations__)}"
            )
        seed = options.get("seed")
        self.seed = seed
        self._rng = seeded_rng(seed)
        #: Draws after which a row leaves this sampler, counted in the database across
        #: every process (None: rows are drawn forever). See :func:`draw`.
        self.consume_after = check_int(
            "consume_after", options.get("consume_after"), minimum=1, optional=True
        )
        self.max_staleness = check_staleness(options.get("max_staleness"))
        self._derived = DerivedArrays()
        self._key_state = KeyState()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A sampler that weighs its rows says so, or overrides weights().
        cls.weighs_rows = cls.weighs_rows or cls.weights is not KeySampler.weights

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls.choose_flat is KeySampler.choose_flat and cls.sample_keys is KeySampler.sample_keys:
            raise UnsupportedTypeError(
                f"Can't instantiate abstract class {cls.__name__}: a key sampler implements "
                "choose_flat (its draw over a KeySpace), or sample_keys (over its key index "
                "alone)"
            )
        return super().__new__(cls)

    @property
    def rng(self) -> np.random.Generator:
        """The random stream all draws come from (created on first use if a subclass
        forgot to call ``super().__init__``)."""
        rng = self._rng
        if rng is None:
            rng = self._rng = np.random.default_rng(self.seed)
        return rng

    def reseed(self, seed: Any) -> None:
        super().reseed(seed)  # generators a subclass holds
        self._rng = np.random.default_rng(seed)

    @property
    def key_state(self) -> KeyState:
        """What this sampler holds of the buffer it draws from (see :class:`KeyState`)."""
        state = self._key_state
        if state is None:
            state = self._key_state = KeyState()
        return state

    def forget_buffer(self) -> None:
        self._key_state = KeyState()

    # -- consume_after: the rows every process together has spent -------------------------
    # What a key sampler knows of them, so that it leaves them out of its key index rather
    # than have the database refuse them one by one (the counting itself is :func:`draw`'s,
    # see :mod:`expstore.draw_counts`).
    def forget_spent(self) -> None:
        """Forget the spent keys learned (of a buffer this sampler no longer draws from)."""
        state = self.key_state
        state.spent, state.unspent, state.spent_read = NO_KEYS, None, False

    def spent_keys(self) -> np.ndarray:
        return self.key_state.spent

    def spend(self, keys: np.ndarray) -> None:
        state = self.key_state
        state.spent = np.union1d(state.spent, keys)
        if len(keys):  # others spent rows too, maybe: read them before the next choice
            state.spent_read = False

    def _learn_spent(self, storage: Storage, index: dict[str, Any]) -> dict[str, Any]:
        """``index``, after learning which rows every process together has spent
        (consume_after), at the first choice over a key index and after each refusal:
        rows spent elsewhere are then left out rather than refused one by one. (A read
        of the buffer's draw counts.)"""
        limit = self.consume_after
        if limit is not None and not self.key_state.spent_read:
            self._read_spent(storage, limit)
        return index

    def _read_spent(self, storage: Storage, limit: int) -> None:
        """Leave out every row the buffer's draw counts say is spent (a read of them)."""
        self.spend(storage.spent_keys(limit))
        self.key_state.spent_read = True

    def _without_spent(self, index: dict[str, Any]) -> dict[str, Any]:
        state = self.key_state
        spent = state.spent
        if not len(spent):
            return index
        # Kept while the spent keys and the index's arrays are these very arrays.
        others, arrays = whole_index(index)
        sources = (spent, *arrays)
        cached = state.unspent
        if cached is not None and cached[0] == others and same_arrays(cached[1], sources):
            return cached[2]
        unspent = masked(index, ~np.isin(index["key"], spent, assume_unique=True))
        state.unspent = (others, sources, unspent)
        return unspent

    def newly_spent(self, storage: Storage, index: dict[str, Any]) -> bool:
        """Whether rows of ``index`` that matter to this sampler's draw have been spent by
        other processes since it last read the spent rows; if so, they are left out (and
        the index is made again). Rows drawn from it are counted (and spent ones
        refused) anyway; a sampler whose draw depends on more than the rows drawn (the
        normaliser of prioritized weights) checks those here."""
        return False

    def derived(self, name: str, sources: tuple[np.ndarray, ...], compute: Callable[[], _T]) -> _T:
        """``compute()``, remembered while ``sources`` are the same array objects.

        See :class:`DerivedArrays`; use it for work over the whole index (a cumulative sum,
        a grouping) so it happens once per change of the buffer, not once per batch.
        """
        return self._derived_arrays().get(name, sources, compute)

    def index_columns(self) -> tuple[str, ...]:
        """The columns to ask ``key_index`` for (``columns`` unless an instance overrides)."""
        return tuple(self.columns)

    def columns_read(self) -> tuple[str, ...]:
        """:meth:`index_columns`, and ``policy_version`` for ``max_staleness``."""
        columns = self.index_columns()
        if self.max_staleness is not None and "policy_version" not in columns:
            columns += ("policy_version",)
        return columns

    def read_index(self, storage: Storage, query_condition: QueryCondition) -> dict[str, Any]:
        """The arrays :meth:`sample_keys` chooses from: ``storage.key_index`` of the matching
        rows and :meth:`columns_read`. A sampler that also needs something of the whole
        buffer adds it here."""
        return storage.key_index(query_condition, self.columns_read())

    def _fresh(self, storage: Storage, index: dict[str, Any]) -> dict[str, Any]:
        """``index`` without the rows ``max_staleness`` leaves out at the buffer's current
        policy version (read now; the filtered arrays are kept while it stays)."""
        k = self.max_staleness
        if k is None or not len(index["key"]):
            return index
        current = with_current_version(storage, index)["current_version"]

        def compute() -> dict[str, Any]:
            keep = fresh_mask(index["policy_version"], current, k)
            if keep is None:
                return index
            return masked(index, keep)

        others, arrays = whole_index(index)
        return self.derived(f"fresh:{current}:{k}:{others}", arrays, compute)

    def sample_keys(
        self, index: dict[str, np.ndarray], batch_size: int, rng: np.random.Generator
    ) -> np.ndarray:
        """Choose keys from ``index["key"]`` (int64, ascending = insertion order).

        By default :meth:`choose_flat` over the index made a key space
        (:class:`~expstore.samplers.index_space.IndexKeySpace`), drawing from this
        sampler's stream (``rng`` is it). A sampler that chooses over the index its own way
        overrides it instead of :meth:`choose_flat`: ``index`` also holds the arrays named in
        ``columns`` (aligned with ``"key"``; floats are float64 with NaN for NULL; the
        arrays are read-only and shared, never modify them), ``index["key"]`` is never empty
        here; return the chosen keys in batch order (repeats allowed), or raise
        :class:`~expstore.EmptyBufferError` if no row is eligible.
        """
        return self._choose_listed(index, batch_size, None).keys

    def index_space(self, index: dict[str, Any], query_condition: QueryCondition) -> KeySpace:
        """``index`` (the matching rows' key index) as a key space held in memory."""
        return IndexKeySpace(
            index,
            self._derived_arrays(),
            query_condition=query_condition,
            max_staleness=self.max_staleness,
            consume_after=self.consume_after,
        )

    def _choose_listed(
        self, index: dict[str, Any], batch_size: int, query_condition: QueryCondition
    ) -> Choice:
        """:meth:`choose_flat` over ``index`` held in memory (its rows all eligible)."""
        choice = self.choose_flat(
            self.index_space(index, query_condition), batch_size, query_condition
        )
        if choice is None:
            raise EmptyBufferError("no matching row can be drawn")
        if choice.key_index is None:
            return Choice(np.asarray(choice.keys, dtype=np.int64), index)
        return choice

    def weights(self, index: dict[str, np.ndarray], keys: np.ndarray) -> np.ndarray | None:
        """Importance-sampling weights for a batch of ``keys`` (all fetched), aligned with
        them; None for a sampler that does not weigh rows."""
        return None

    def can_draw_flat(self, query_condition: QueryCondition) -> bool:
        """Whether :meth:`choose_flat` may draw over the database's key space under this
        condition (by default: when the sampler is written as :meth:`choose_flat`)."""
        return type(self).choose_flat is not KeySampler.choose_flat

    def drawable(self) -> Condition | None:
        """A condition every row this sampler can ever draw holds, besides the caller's
        condition and ``max_staleness`` (None: every row). A claim ordered by the sampler
        that runs short of rows it draws fills up among the claimable rows that hold it
        (and are within ``max_staleness``), so it never returns a row the sampler itself
        would not."""
        return None

    def narrowed(self, query_condition: QueryCondition) -> bool:
        """Whether only some of the buffer's rows are this sampler's to draw: a condition,
        ``max_staleness`` or ``consume_after``."""
        return (
            query_condition is not None
            or self.max_staleness is not None
            or self.consume_after is not None
        )

    def choose_flat(
        self, space: KeySpace, batch_size: int, query_condition: QueryCondition
    ) -> Choice | None:
        """The sampler's draw, written once against a :class:`KeySpace`: the database's
        (candidate keys probed in the buffer's key range, nothing held that grows with the
        buffer; see :mod:`expstore.samplers.flat`), and, when that returns None or the
        storage has none, the matching rows' key index held in memory
        (:class:`~expstore.samplers.index_space.IndexKeySpace`, whose ``listed`` arrays
        :func:`~expstore.samplers.flat.draw_uniform` draws positions in directly). A custom
        sampler implements this one method; None over the key index means no row can be
        drawn, and EmptyBufferError says why."""
        return None

    def _choose_flat(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition
    ) -> Choice | None:
        if not self.flat or not self.can_draw_flat(query_condition):
            return None
        key = describe_condition(query_condition)
        skips = self.key_state.flat_skips
        if skips.get(key, 0) > 0:  # it gave up lately under this condition
            skips[key] -= 1
            return None
        try:
            choice = storage.key_space(
                query_condition,
                lambda space: self.choose_flat(space, batch_size, query_condition),
                max_staleness=self.max_staleness,
                consume_after=self.consume_after,
                snapshot=self.flat_snapshot,
            )
        except EmptyBufferError as exc:
            raise empty_error(storage, query_condition, str(exc)) from None
        if choice is None:
            skips[key] = _FLAT_SKIPS
        return choice

    def draw_rows(
        self,
        space: KeySpace,
        batch_size: int,
        query_condition: QueryCondition,
        **options: Unpack[DrawOptions],
    ) -> Drawn | None:
        """:func:`~expstore.samplers.flat.draw_uniform` over ``space`` (with ``options``)
        with this sampler's random stream and :attr:`probe_budget`, its first round sized
        by the share of candidates the last draw under this condition kept
        (:meth:`kept_hint`), which this one's share then replaces."""
        hint = self.kept_hint(query_condition)
        drawn = draw_uniform(
            space, batch_size, self.rng, hint=hint, budget=self.probe_budget, **options
        )
        if drawn is not None:
            self.kept_hint(query_condition, drawn.kept)
        return drawn

    def choose_rows(
        self,
        space: KeySpace,
        batch_size: int,
        query_condition: QueryCondition,
        **options: Unpack[DrawOptions],
    ) -> Choice | None:
        """The keys :meth:`draw_rows` draws, as a choice (None when it gives up)."""
        drawn = self.draw_rows(space, batch_size, query_condition, **options)
        return None if drawn is None else Choice(drawn.keys)

    def kept_hint(self, query_condition: QueryCondition, kept: float | None = None) -> float:
        """The share of candidate keys the last flat draw under this condition kept (1.0
        at first), remembered when ``kept`` is given; it sizes the next first round."""
        hints = self.key_state.kept_hints
        key = describe_condition(query_condition)
        if kept is not None:
            hints[key] = kept
        return float(hints.get(key, 1.0))

    def choose(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
    ) -> Choice:
        flat = self._choose_flat(storage, batch_size, query_condition)
        if flat is not None:
            return flat
        whole = self._learn_spent(storage, self.read_index(storage, query_condition))
        matching = self._without_spent(whole)
        index = self._fresh(storage, matching)
        while len(index["key"]) and self.newly_spent(storage, index):
            matching = self._without_spent(whole)
            index = self._fresh(storage, matching)
        if not len(index["key"]):
            if len(matching["key"]):
                raise empty_error(
                    storage,
                    query_condition,
                    f"every matching row is more than max_staleness={self.max_staleness} "
                    f"policy versions behind the current version {matching.get('current_version')}",
                )
            if len(whole["key"]):
                raise empty_error(
                    storage,
                    query_condition,
                    f"every matching row has been drawn consume_after={self.consume_after} times",
                )
            raise empty_error(storage, query_condition, "no rows match")
        try:
            if type(self).sample_keys is KeySampler.sample_keys:  # written as choose_flat
                return self._choose_listed(index, batch_size, query_condition)
            keys = np.asarray(self.sample_keys(index, batch_size, self.rng), dtype=np.int64)
        except EmptyBufferError as exc:
            raise empty_error(storage, query_condition, str(exc)) from None
        return Choice(keys, index)

    def weights_of(self, choice: Choice) -> np.ndarray | None:
        """The importance weights of ``choice``'s keys, aligned with them (None from a
        sampler that does not weigh rows): those drawn with them
        (``key_index["drawn_weights"]``: a draw over the key space, a batch pieced
        together by ``consume_after``), else :meth:`weights` over its key index."""
        index = choice.key_index
        if not self.weighs_rows or index is None:
            return None
        if "drawn_weights" in index and index["key"] is choice.keys:
            return cast("np.ndarray", index["drawn_weights"])
        return self.weights(index, choice.keys)

    def describe(self, choice: Choice, ids: list[str]) -> SampleInfo:
        info = SampleInfo(choice.keys, ids, self.weights_of(choice))
        self.last_info = info
        return info

    def sample(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
    ) -> list[DataRow]:
        return self.sample_with_info(storage, batch_size, query_condition)[0]


def with_current_version(storage: Storage, index: dict[str, Any]) -> dict[str, Any]:
    """``index`` with ``"current_version"``, the buffer's policy version: the one the key
    index read in its freshness round trip, or read now from a storage whose key index
    does not bring it."""
    if "current_version" in index:
        return index
    return {**index, "current_version": storage.policy_version()}


class TaskSampler(Sampler):
    """Chooses whole tasks (trajectories), as AWorld's ``TaskSampler``.

    Implement :meth:`sample_task_ids`. In the sampling loop a batch is every row of each
    chosen task, task by task, each ordered by step, then execute_time (then insertion);
    :meth:`sample_tasks` gives the same rows grouped by task.
    """

    @abstractmethod
    def sample_task_ids(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
    ) -> list[str]:
        """Up to ``batch_size`` task ids among tasks with at least one matching row."""

    #: The whole buffer's index columns that order a task's rows.
    TASK_COLUMNS: ClassVar[tuple[str, ...]] = ("task_id", "step", "execute_time")

    def choose(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
    ) -> Choice:
        task_ids = self.sample_task_ids(storage, batch_size, query_condition)
        return Choice(self.task_keys(storage.key_index(None, self.TASK_COLUMNS), task_ids))

    def task_keys(self, index: dict[str, np.ndarray], task_ids: Sequence[str]) -> np.ndarray:
        """The keys of every row of these tasks in ``index`` (the whole buffer's, with
        :attr:`TASK_COLUMNS`), task by task, each by step, execute_time and insertion."""
        order, first, count = self._task_order(index)
        codes = self._codes(index)
        spans = [
            order[first[t] : first[t] + count[t]] for t in map(codes.get, task_ids) if t is not None
        ]
        chosen = np.concatenate(spans) if spans else np.empty(0, dtype=np.intp)
        return index["key"][chosen]

    def _codes(self, index: dict[str, np.ndarray]) -> dict[str, int]:
        """Each task id's number in the whole buffer's index."""
        task_ids = index["task_id"]
        return self._derived_arrays().get(
            "codes", (task_ids,), lambda: numbering(task_ids.tolist())
        )

    def _task_order(self, index: dict[str, np.ndarray]) -> tuple[np.ndarray, Any, Any]:
        """(row positions ordered by task, step, execute_time and key; each task's first
        position in that order; its row count), by task number."""

        def compute() -> tuple[np.ndarray, Any, Any]:
            codes = value_codes(index["task_id"].tolist())
            order = np.lexsort((index["key"], index["execute_time"], index["step"], codes))
            counts = np.bincount(codes) if len(codes) else np.zeros(0, dtype=np.int64)
            firsts = np.concatenate([[0], np.cumsum(counts)[:-1]]) if len(counts) else counts
            return order, firsts.tolist(), counts.tolist()

        sources = (index["key"], index["task_id"], index["step"], index["execute_time"])
        return self._derived_arrays().get("tasks", sources, compute)

    def sample_tasks(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
    ) -> dict[str, list[DataRow]]:
        """The chosen tasks' rows, grouped by task id in the order the tasks were chosen."""
        return draw_tasks(storage, self, batch_size, query_condition)

    def sample(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
    ) -> list[DataRow]:
        """Every row of up to ``batch_size`` chosen tasks, task by task."""
        return self.sample_with_info(storage, batch_size, query_condition)[0]
