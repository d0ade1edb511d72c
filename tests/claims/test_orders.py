"""Claim orders: the one place that decides what a claim makes of its ``order``, on SQLite
and Postgres."""

from __future__ import annotations

import pytest

from expstore import DataRow, Experience, ExpMeta, GroupSampler, PrioritizedSampler, ReplayBuffer
from expstore.claims.orders import Drawn, Oldest, WholeGroups, claim_order
from expstore.claims.queue import Scope
from expstore.errors import InvalidArgumentError, UnsupportedTypeError
from expstore.query import QueryBuilder


def _rows(n: int, groups: int = 4) -> list[DataRow]:
    return [
        DataRow(
            exp_meta=ExpMeta(task_id=f"g{i % groups}", agent_id="a", step=i // groups),
            exp_data=Experience(reward_t=float(i)),
        )
        for i in range(n)
    ]


def test_each_order_is_its_strategy(buf: ReplayBuffer) -> None:
    buf.store_batch(_rows(16))
    sql, scope = buf.sql, Scope(None, None)
    assert type(claim_order("oldest", sql, None, scope)) is Oldest
    drawn = claim_order("random", sql, None, scope)
    assert type(drawn) is Drawn and drawn.candidates is not None and drawn.unit == 1
    groups = claim_order(GroupSampler(group_size=4), sql, None, scope)
    assert type(groups) is WholeGroups and groups.groups is not None and groups.unit == 4
    assert groups.claimable(16) == 16 and "group of 4" in groups.what
    assert claim_order("oldest", sql, None, scope).claimable(5) == 5
    with pytest.raises(UnsupportedTypeError, match="oldest"):
        claim_order("newest", sql, None, scope)


def test_a_sampler_narrows_the_scope_to_what_it_can_draw(buf: ReplayBuffer) -> None:
    buf.store_batch(_rows(8))
    condition = QueryBuilder().eq("exp_meta.agent_id", "a").build()
    drawn = claim_order(
        PrioritizedSampler(max_staleness=3), buf.sql, condition, Scope(condition, 5)
    )
    assert drawn.scope.max_staleness == 3  # the tighter of the claim's and the sampler's
    oldest = claim_order("oldest", buf.sql, condition, Scope(condition, 5))
    assert oldest.scope.max_staleness == 5


def test_whole_groups_refuse_a_batch_that_is_not_whole_groups(buf: ReplayBuffer) -> None:
    buf.store_batch(_rows(16))
    with pytest.raises(InvalidArgumentError, match="multiple of 4"):
        buf.claim(6, consumer="c", order=GroupSampler(group_size=4))
    with pytest.raises(InvalidArgumentError, match="min_batch_size=2"):
        buf.claim(8, consumer="c", order=GroupSampler(group_size=4), wait_s=0, min_batch_size=2)
    assert buf.queue_stats().leased == 0  # nothing taken
    claim = buf.claim(8, consumer="c", order=GroupSampler(group_size=4))
    assert len(claim.ids) == 8
