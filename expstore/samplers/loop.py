"""The sampling loop, :func:`draw`: a sampler chooses keys, the storage fetches what the
converter reads, the sampler describes the batch; with the rate limit's count, the choice
made again for rows deleted meanwhile or a lost replica, and ``consume_after``'s counted
draws. :func:`draw_tasks` is the same loop cut at its tasks (``sample_task``).

The loop takes any :class:`Chooser` (what :class:`~expstore.samplers.base.Sampler` is), so
the interfaces above it call it, never the other way round.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple, Protocol

import numpy as np

from .._args import check_batch_size
from ..errors import ConnectionLostError, EmptyBufferError, StorageError
from ..model.rows import DataRow
from ..query import QueryCondition, as_condition
from ..storage.base import Fetched, KeySpace, Storage
from .state import NO_KEYS

__all__ = [
    "CONSUME_ATTEMPTS",
    "FETCH_ATTEMPTS",
    "REPLICA_ATTEMPTS",
    "Choice",
    "Chooser",
    "SampleInfo",
    "carried",
    "describe_condition",
    "draw",
    "draw_tasks",
    "empty_error",
]


class Chooser(Protocol):
    """What the loop asks of a sampler (:class:`~expstore.samplers.base.Sampler` is one)."""

    @property
    def weighs_rows(self) -> bool: ...
    @property
    def whole_units(self) -> bool: ...
    @property
    def consume_after(self) -> int | None: ...

    def on_buffer(self, storage: Storage) -> bool: ...
    def mark(self) -> Any: ...
    def rewind(self, mark: Any) -> None: ...
    def choose(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
    ) -> Choice: ...
    def spent_keys(self) -> np.ndarray: ...
    def spend(self, keys: np.ndarray) -> None: ...
    def weights_of(self, choice: Choice) -> np.ndarray | None: ...
    def describe(self, choice: Choice, ids: list[str]) -> SampleInfo: ...


def describe_condition(query_condition: QueryCondition) -> str:
    """A readable form of a condition for messages (``str(condition)``)."""
    if query_condition is None:
        return "none, all rows"
    try:
        return str(as_condition(query_condition))
    except Exception:  # noqa: BLE001 - only for a message; fall back to the raw value
        return str(query_condition)


def empty_error(storage: Storage, query_condition: QueryCondition, what: str) -> EmptyBufferError:
    """The EmptyBufferError for ``what`` (e.g. "no rows match") under ``query_condition``."""
    where = f" in buffer {storage.name!r}" if storage.name else ""
    return EmptyBufferError(
        f"cannot sample: {what}{where} (condition: {describe_condition(query_condition)}); "
        "store rows first or loosen the condition"
    )


# -- the sampling loop -----------------------------------------------------------------------
# The sampling loop, one straight line, as TorchRL's ``ReplayBuffer._sample``:
#
# 1. the sampler chooses keys over the storage's cached key index (:meth:`Sampler.choose`);
# 2. the storage fetches what the converter reads (:meth:`Storage.fetch`: whole rows, or only
#    the fields at the converter's paths);
# 3. keys whose rows were deleted in between (by an evicting writer, say) are chosen again;
# 4. the sampler describes the batch (:class:`SampleInfo`: keys, ids, importance weights);
# 5. the converter builds the batch and the extras are attached to it.
#
# A sampler only chooses and a converter only builds; the loop is the same whatever either
# is, so every sampler behaves the same with every converter. An AWorld-style sampler that
# returns rows from its own ``sample()`` brings its rows in step 1 instead of keys.
#: How many times a sampler chooses again when rows it chose were deleted by another writer
#: before they could be fetched.
FETCH_ATTEMPTS = 5
#: How many times a batch is chosen again after its connection (to a read replica or the
#: primary) was lost in the middle of it (see :mod:`expstore.db.replicas`).
REPLICA_ATTEMPTS = 3
#: How many times a sampler with ``consume_after`` chooses again for the places of rows the
#: database refused (drawn ``consume_after`` times already); each time it learns them.
CONSUME_ATTEMPTS = 50


class Choice(NamedTuple):
    """What a sampler chose: keys to fetch (with the index they were chosen from), or, for
    an AWorld-style sampler whose ``sample()`` returns rows, those rows."""

    keys: np.ndarray
    key_index: dict[str, Any] | None = None
    rows: list[DataRow] | None = None


class SampleInfo(NamedTuple):
    """What the sampler says about a batch beside its rows, aligned with them."""

    #: The chosen keys, in batch order (empty for a sampler that returned rows itself).
    keys: np.ndarray
    #: The ids of the rows in the batch, in batch order (for ``update_priorities``).
    ids: list[str]
    #: Importance-sampling weights (float32), from samplers that weigh rows; else None.
    weights: np.ndarray | None = None

    def extras(self) -> dict[str, Any]:
        """What a dict batch gains: ``weights`` and ``ids`` from a sampler that weighs
        rows (:class:`~expstore.PrioritizedSampler`), nothing otherwise."""
        if self.weights is None:
            return {}
        return {"weights": self.weights, "ids": list(self.ids)}


def draw(
    storage: Storage,
    sampler: Chooser,
    batch_size: int,
    query_condition: QueryCondition = None,
    paths: list[str] | None = None,
    *,
    writable: bool = True,
) -> tuple[Fetched, SampleInfo]:
    """Up to ``batch_size`` rows chosen by ``sampler`` among those matching the condition,
    fetched whole or at ``paths``, and what the sampler says about them.

    A row deleted between choosing and fetching is chosen again from the fresh index, up
    to :data:`FETCH_ATTEMPTS` times; after that a sampler that weighs rows (whose weights
    must stay aligned) or draws whole units (windows, groups, whose layout must hold)
    raises StorageError and any other returns the rows it could fetch.

    A sampler with ``consume_after=k`` chooses through :func:`_choose_consuming`: no row is
    ever returned more than k times in all, by every process together. Rows it counted are
    owed to this batch: a batch chosen again (a rate limit's wait, a lost connection, even
    in the middle of the choice, rows deleted before the fetch) keeps those still stored
    and matching (the version may have moved) and chooses only the rest, after a rate
    limit's wait no more rows than the limit counted.

    Under a rate limit (:mod:`expstore.limits.rate_limiter`) the batch is counted before it is
    fetched, waiting while the budget is spent (RateLimitedError after the limiter's
    timeout); a batch chosen again larger than counted counts the rest; rows chosen but
    not returned are given back.
    """
    batch_size = check_batch_size(batch_size)
    sampler.on_buffer(storage)
    deleted = lost = remade = 0
    started = time.monotonic()
    held = storage.reserve_samples()
    # A batch chosen again (rows deleted before the fetch, a rate limit's wait, a lost
    # connection) starts from where the first choice did: an epoch loses no rows to it.
    mark = sampler.mark()
    chosen_before = False
    consuming = sampler.consume_after is not None
    #: A consume_after batch's rows counted so far, owed to this batch, in parts as they
    #: were chosen (the sampler is not rewound past them: an epoch gave them already).
    owed: list[Choice] = []
    with held:
        while True:
            if chosen_before and not owed:
                sampler.rewind(mark)
            chosen_before = True
            empty: EmptyBufferError | None = None
            try:
                if consuming:
                    # Chosen again after a rate limit's wait: no more rows than were
                    # counted (counting more could wait again, and the rows' draws are
                    # counted already).
                    wanted = batch_size if not held.counted else min(batch_size, held.counted)
                    choice = _choose_consuming(storage, sampler, wanted, query_condition, owed)
                else:
                    choice = sampler.choose(storage, batch_size, query_condition)
            except ConnectionLostError:
                lost += 1
                if lost > REPLICA_ATTEMPTS:
                    raise
                continue
            except EmptyBufferError as exc:
                empty = exc
            if sampler.on_buffer(storage) and remade < REPLICA_ATTEMPTS:
                # The choice found the database made anew, and the sampler chose (or found
                # nothing) by what it held of the old one (an epoch, rows known spent):
                # choose again (a few times: servers that take turns between the old and
                # the new database would otherwise keep it choosing).
                remade += 1
                mark, chosen_before = sampler.mark(), False
                continue
            if empty is not None:
                if held.asked:
                    raise empty
                # Under a rate limit an empty buffer is one below its min_size: wait for
                # the budget as Reverb does, then choose again. Budget granted at once
                # means rows arrived since the choice found none: choose again too (once:
                # an empty choice with samples counted raises above).
                waited = held.add(batch_size, since=started)
                if waited or held.counted:
                    continue
                raise empty
            size = len(choice.keys) if choice.rows is None else len(choice.rows)
            if not held.asked or 0 < held.counted < size:
                # The buffer's rate limit (if any) counts the batch before it is fetched (a
                # batch chosen again larger than counted, the rest); a batch that had to
                # wait is chosen again, from the buffer as it is now.
                waited = held.add(size - held.counted, since=started)
                if waited:
                    continue
            if choice.rows is not None:
                fetched = Fetched([row.id for row in choice.rows], rows=choice.rows)
                break
            try:
                fetched = storage.fetch(choice.keys, paths, writable=writable)
            except ConnectionLostError:
                # The connection went away mid-read (a replica is then left for a while,
                # so the next attempt reads from another replica or the primary).
                lost += 1
                if lost > REPLICA_ATTEMPTS:
                    raise
                continue
            if len(fetched.ids) == len(choice.keys):
                break
            deleted += 1  # chosen again: the owed rows still stored stay (_choose_consuming)
            if deleted == FETCH_ATTEMPTS:
                if sampler.weighs_rows or sampler.whole_units:
                    raise StorageError(
                        f"{type(sampler).__name__}: rows chosen from the index kept being deleted "
                        f"before they could be fetched ({FETCH_ATTEMPTS} attempts); another "
                        "process is deleting or evicting faster than this sampler reads. Retry "
                        "the call"
                    )
                break
        held.use(len(fetched.ids))  # the rest of the count goes back (all of it on an error)
    return fetched, sampler.describe(choice, fetched.ids)


def draw_tasks(
    storage: Storage,
    sampler: Chooser,
    batch_size: int,
    query_condition: QueryCondition = None,
) -> dict[str, list[DataRow]]:
    """The rows of up to ``batch_size`` tasks chosen by ``sampler``, grouped by task id in
    the order the tasks were chosen: a batch of :func:`draw` (so a rate limit counts its
    rows, the row cache serves them and a lost replica is retried), cut at its tasks."""
    fetched, _ = draw(storage, sampler, batch_size, query_condition)
    assert fetched.rows is not None
    tasks: dict[str, list[DataRow]] = {}
    for row in fetched.rows:
        tasks.setdefault(row.exp_meta.task_id, []).append(row)
    return tasks


def _choose_consuming(
    storage: Storage,
    sampler: Chooser,
    batch_size: int,
    query_condition: QueryCondition,
    owed: list[Choice],
) -> Choice:
    """The sampler's choice with each row's draw counted in the database first
    (:meth:`Storage.count_draws`): rows drawn ``consume_after`` times already, by any
    process, are refused, left out by the sampler from then on, and their places chosen
    again. A batch holds each row once (a sampler drawing with replacement gives a shorter
    batch when it drew a row twice); EmptyBufferError once every matching row is spent.

    ``owed``: the rows counted for this batch so far (see :func:`draw`), in parts as they
    were chosen; each part counted here is added to it at once, so an error after it
    (a lost connection) loses no counted row. A batch chosen again begins with those still
    matching. A sampler that weighs rows gives each row the weight of the choice that
    drew it."""
    limit = sampler.consume_after
    assert limit is not None  # draw() chooses through here only then
    if owed:  # chosen again: the rows owed that still match (the version may have moved)
        joined = _joined(sampler, owed)
        owed[:] = [carried(sampler, joined, _matching(storage, sampler, query_condition, joined))]
    taken = _taken(owed)
    for _ in range(CONSUME_ATTEMPTS):
        if len(taken) >= batch_size:
            break
        try:
            choice = sampler.choose(storage, batch_size - len(taken), query_condition)
        except EmptyBufferError:
            if len(taken):
                break
            raise
        if choice.rows is not None:
            return choice
        _, first = np.unique(choice.keys, return_index=True)
        drawn = choice.keys[np.sort(first)]
        drawn = drawn[~np.isin(drawn, taken)]
        # Rows refused before are not counted again (a draw over the key space read on a
        # replica behind the primary may still offer them).
        known = sampler.spent_keys()
        asked = drawn if not len(known) else drawn[~np.isin(drawn, known)]
        counted = storage.count_draws(asked, limit)
        sampler.spend(np.setdiff1d(asked, counted))
        owed.append(carried(sampler, choice, counted))
        taken = _taken(owed)
        if len(counted) == len(drawn):
            break  # nothing refused: the batch is as the sampler chose it
    if not len(taken):  # every row chosen, again and again, was spent
        raise empty_error(
            storage,
            query_condition,
            f"every matching row has been drawn consume_after={limit} times",
        )
    return _joined(sampler, owed)


def _joined(sampler: Chooser, parts: list[Choice]) -> Choice:
    """One choice of ``parts`` in order, each row with its part's weight."""
    if len(parts) == 1:
        return parts[0]
    taken = _taken(parts)
    if not sampler.weighs_rows:
        return Choice(taken, parts[-1].key_index)
    weights = np.concatenate([part.key_index["drawn_weights"] for part in parts])  # type: ignore[index]
    return Choice(taken, {"key": taken, "drawn_weights": weights})


def carried(sampler: Chooser, choice: Choice, keys: np.ndarray) -> Choice:
    """The part of ``choice`` at ``keys`` (some of its keys, each once, in their order in
    the choice), with their importance weights if the sampler weighs rows (as
    ``key_index["drawn_weights"]``, which :meth:`Sampler.describe` gives for them)."""
    _, first = np.unique(choice.keys, return_index=True)
    at = np.sort(first[np.isin(choice.keys[first], keys)])
    part = choice.keys[at]
    weights = sampler.weights_of(choice)
    if weights is None:
        return Choice(part, choice.key_index)
    return Choice(part, {"key": part, "drawn_weights": weights[at]})


def _matching(
    storage: Storage, sampler: Chooser, query_condition: QueryCondition, choice: Choice
) -> np.ndarray:
    """Those of ``choice``'s keys whose rows are still stored and match the condition and
    the sampler's ``max_staleness`` (their draws are counted: ``consume_after`` aside)."""
    keys = choice.keys
    max_staleness = getattr(sampler, "max_staleness", None)

    def probe(space: KeySpace) -> np.ndarray:
        found = space.probe(keys)["key"]
        assert found is not None
        return found

    found = storage.key_space(query_condition, probe, max_staleness=max_staleness)
    if found is None:  # a storage without a key space: through its key index
        index = storage.key_index(query_condition)
        found = np.intersect1d(keys, index["key"])
    return found


def _taken(parts: list[Choice]) -> np.ndarray:
    return np.concatenate([part.keys for part in parts]) if parts else NO_KEYS
