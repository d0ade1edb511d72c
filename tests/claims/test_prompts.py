"""Prompt queues on both backends: completion targets (one actor per group, or a group
in parts over several actors), lineage of completions, admission by staleness and
backlog, what queue_stats shows, and the bad input each refuses with nothing changed."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from expstore import AdmissionTimeoutError, DataRow, InvalidArgumentError, ReplayBuffer
from expstore.claims import Admission
from expstore.errors import ClaimFinishedError, DuplicateIdError, UnsupportedTypeError
from tests.helpers import make_row


@pytest.fixture
def queues(db_url: str, buffer_name: str) -> Iterator[tuple[ReplayBuffer, ReplayBuffer]]:
    with ReplayBuffer(db_url, name=buffer_name) as prompts:
        with ReplayBuffer(db_url, name=buffer_name + "_rollouts") as rollouts:
            yield prompts, rollouts


def prompt(i: int) -> DataRow:
    row = make_row(f"task{i}", state={"question": f"q{i}"})
    return row.model_copy(update={"id": f"p{i}"})


def completions(prompt_id: str, n: int, start: int = 0) -> list[DataRow]:
    made = [make_row(prompt_id.split("#")[0], "actor", start + j) for j in range(n)]
    return [
        row.model_copy(update={"id": f"{prompt_id}/c{start + j}"}) for j, row in enumerate(made)
    ]


def test_a_prompt_stays_claimable_until_its_target_of_completions_is_stored(
    queues, buffer_name: str
) -> None:
    prompts, rollouts = queues
    report = prompts.store_prompts([prompt(0), prompt(1)], group_size=4)
    assert report.stored == 2
    claim = prompts.claim(1, consumer="actor-0")
    assert claim.ids == ["p0"] and claim.needs == {"p0": 4}
    claim.save_progress({"tokens": [1, 2]})
    # Three of four completions came out (one generation failed): stored, prompt released.
    assert claim.ack(produce={"p0": completions("p0", 3)}, into=rollouts) == 0
    assert claim.unfinished == ["p0"] and len(rollouts) == 3
    again = prompts.claim(1, consumer="actor-1")
    assert again.ids == ["p0"] and again.needs == {"p0": 1}
    assert again.progress == {}  # the ack that stored completions removed the progress
    assert again.ack(produce=completions("p0", 1, start=3), into=rollouts) == 1
    assert again.unfinished == []
    nxt = prompts.claim(5, consumer="actor-1")
    assert nxt.ids == ["p1"]  # p0 is done
    nxt.release()
    lineage = prompts.lineage(["p0", "p1"])
    assert (lineage["p0"].state, lineage["p0"].target, lineage["p0"].done) == ("consumed", 4, 4)
    assert (lineage["p1"].state, lineage["p1"].target, lineage["p1"].done) == ("unclaimed", 4, 0)
    made = rollouts.lineage(["p0/c0", "p0/c3"])
    assert made["p0/c0"].produced_by.consumer == "actor-0"
    assert made["p0/c0"].produced_by.prompt_id == "p0"
    assert made["p0/c0"].produced_by.prompt_buffer == buffer_name
    assert made["p0/c0"].produced_by.claim_id == claim.claim_id
    assert made["p0/c3"].produced_by.claim_id == again.claim_id
    stats = prompts.queue_stats()
    assert stats.completions is not None
    assert stats.completions._asdict() == {"prompts": 2, "done": 1, "target": 8, "stored": 4}


def test_a_group_in_parts_is_generated_by_several_actors_at_once(queues) -> None:
    prompts, rollouts = queues
    prompts.store_prompts([prompt(0)], group_size=10, parts=4)
    claims = [prompts.claim(1, consumer=f"actor-{i}") for i in range(4)]
    assert sorted(c.ids[0] for c in claims) == ["p0#0", "p0#1", "p0#2", "p0#3"]
    shares = {c.ids[0]: c.needs[c.ids[0]] for c in claims}
    assert shares == {"p0#0": 3, "p0#1": 3, "p0#2": 2, "p0#3": 2}
    assert prompts.claim(1, consumer="actor-4").ids == []  # every part is held
    stats = prompts.queue_stats()
    assert {f.consumer for f in stats.in_flight} == {f"actor-{i}" for i in range(4)}
    assert sorted(f.needs for f in stats.in_flight) == [2, 2, 3, 3]
    for c in claims:
        part = c.ids[0]
        c.ack(produce=completions(part, shares[part]), into=rollouts)
    assert len(rollouts) == 10
    assert {r.exp_meta.task_id for r in rollouts.query()} == {"p0"}
    assert prompts.queue_stats().consumed == 4
    assert prompts.queue_stats().completions.done == 4


def test_more_completions_than_a_prompt_needs_are_refused_and_nothing_changes(queues) -> None:
    prompts, rollouts = queues
    prompts.store_prompts([prompt(0)], group_size=2)
    claim = prompts.claim(1, consumer="actor")
    with pytest.raises(InvalidArgumentError, match="needs 2 more"):
        claim.ack(produce=completions("p0", 3), into=rollouts)
    assert len(rollouts) == 0
    assert prompts.lineage(["p0"])["p0"].state == "leased"
    assert claim.ack(produce=completions("p0", 2), into=rollouts) == 1
    with pytest.raises(ClaimFinishedError):  # a retried ack stores nothing twice
        claim.ack(produce=completions("p0", 2), into=rollouts)
    assert len(rollouts) == 2


def test_a_claim_of_several_prompts_says_which_completions_are_whose(queues) -> None:
    prompts, rollouts = queues
    prompts.store_prompts([prompt(0), prompt(1)], group_size=[2, 3])
    claim = prompts.claim(2, consumer="actor")
    assert claim.needs == {"p0": 2, "p1": 3}
    with pytest.raises(InvalidArgumentError, match=r"produce=\{row_id"):
        claim.ack(produce=completions("p0", 2), into=rollouts)
    with pytest.raises(InvalidArgumentError, match="not one of claim"):
        claim.ack(produce={"p7": completions("p7", 1)}, into=rollouts)
    assert len(rollouts) == 0
    done = claim.ack(
        produce={"p0": completions("p0", 2), "p1": completions("p1", 1)}, into=rollouts
    )
    assert done == 1 and claim.unfinished == ["p1"]
    assert prompts.claim(2, consumer="actor").needs == {"p1": 2}


def test_an_ack_without_produce_gives_a_prompt_up(queues) -> None:
    prompts, _ = queues
    prompts.store_prompts([prompt(0)], group_size=4)
    prompts.claim(1, consumer="actor").ack()
    assert prompts.claim(1, consumer="actor").ids == []
    assert prompts.lineage(["p0"])["p0"].done == 0


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"group_size": 0}, "group_size"),
        ({"group_size": -2}, "group_size"),
        ({"group_size": 2.5}, "group_size"),
        ({"group_size": [2]}, "1 targets for 2 prompts"),
        ({"group_size": 2, "parts": 3}, "parts=3"),
        ({"group_size": 2, "parts": 0}, "parts"),
    ],
)
def test_bad_prompt_targets_are_refused_and_nothing_is_stored(queues, kwargs, error) -> None:
    prompts, _ = queues
    with pytest.raises(InvalidArgumentError, match=error):
        prompts.store_prompts([prompt(0), prompt(1)], **kwargs)
    assert len(prompts) == 0


def test_prompts_stored_twice_are_refused_whole(queues) -> None:
    prompts, _ = queues
    prompts.store_prompts([prompt(0)], group_size=2)
    with pytest.raises(DuplicateIdError):
        prompts.store_prompts([prompt(1), prompt(0)], group_size=2)
    assert len(prompts) == 1 and prompts.queue_stats().completions.prompts == 1


def test_admission_holds_actors_within_the_staleness_bound(
    queues, db_url: str, buffer_name: str
) -> None:
    prompts, rollouts = queues
    prompts.store_prompts([prompt(i) for i in range(6)], group_size=2)
    # (max_batches_ahead + 1) * batch_size = 4 completions in flight or stored unconsumed.
    prompts.set_admission(rollouts, batch_size=2, max_batches_ahead=1, timeout_s=0.2)
    setting = prompts.admission()  # the bound as set, read back one way
    assert setting == Admission(rollouts.storage.name, 2, 1, None, 0.2)
    first = prompts.claim(5, consumer="actor-0")
    assert first.ids == ["p0", "p1"]  # 2 prompts x 2 completions fill the bound
    state = prompts.admission_stats()
    assert (state.in_flight, state.backlog, state.capacity, state.held_by) == (
        4,
        0,
        0,
        "staleness",
    )
    with pytest.raises(AdmissionTimeoutError) as held:
        prompts.claim(1, consumer="actor-1")
    assert held.value.held_by == "staleness" and held.value.in_flight == 4
    first.ack(produce={i: completions(i, 2) for i in first.ids}, into=rollouts)
    # Stored, not consumed: still counted, as another handle (another host) sees too.
    with ReplayBuffer(db_url, name=buffer_name) as elsewhere:
        assert elsewhere.admission_stats().backlog == 4
        with pytest.raises(AdmissionTimeoutError):
            elsewhere.claim(1, consumer="actor-1", wait_s=0.1)
    rollouts.claim(2, consumer="learner").ack()  # the learner consumes a batch
    second = prompts.claim(5, consumer="actor-1")
    assert second.ids == ["p2"]
    assert prompts.admission_stats().capacity == 0


def test_admission_waits_for_the_learner_then_claims(queues) -> None:
    prompts, rollouts = queues
    prompts.store_prompts([prompt(i) for i in range(2)], group_size=2)
    rollouts.store_batch(completions("old", 2))
    prompts.set_admission(rollouts, batch_size=2, max_batches_ahead=0, timeout_s=None)
    timer = threading.Timer(0.3, lambda: rollouts.claim(2, consumer="learner").ack())
    timer.start()
    try:
        claim = prompts.claim(1, consumer="actor", wait_s=30)
    finally:
        timer.join()
    assert claim.ids == ["p0"]


def test_admission_by_backlog_names_its_bound(queues) -> None:
    prompts, rollouts = queues
    prompts.store_batch([prompt(0), prompt(1)])  # plain rows: one completion each
    rollouts.store_batch(completions("old", 3))
    prompts.set_admission(rollouts, max_backlog=3, timeout_s=0.1)
    with pytest.raises(AdmissionTimeoutError, match="max_backlog") as held:
        prompts.claim(1, consumer="actor")
    assert held.value.held_by == "backlog" and held.value.backlog == 3
    rollouts.claim(1, consumer="learner").ack()
    assert prompts.claim(2, consumer="actor").ids == ["p0", "p1"]  # no staleness bound
    prompts.set_admission(None)
    assert prompts.admission() is None and prompts.admission_stats() is None


def test_a_prompt_larger_than_the_whole_bound_is_refused(queues) -> None:
    prompts, rollouts = queues
    prompts.store_prompts([prompt(0)], group_size=8)
    prompts.set_admission(rollouts, batch_size=2, max_batches_ahead=1)
    with pytest.raises(InvalidArgumentError, match="could never be claimed"):
        prompts.claim(1, consumer="actor")
    assert prompts.queue_stats().leased == 0


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"batch_size": 4}, "go together"),
        ({"max_batches_ahead": 1}, "go together"),
        ({}, "needs a bound"),
        ({"batch_size": 0, "max_batches_ahead": 1}, "batch_size"),
        ({"batch_size": 4, "max_batches_ahead": -1}, "max_batches_ahead"),
        ({"max_backlog": -1}, "max_backlog"),
        ({"max_backlog": 4, "timeout_s": -1}, "timeout_s"),
    ],
)
def test_bad_admission_settings_are_refused(queues, kwargs, error) -> None:
    prompts, rollouts = queues
    with pytest.raises(InvalidArgumentError, match=error):
        prompts.set_admission(rollouts, **kwargs)
    assert prompts.admission() is None
    with pytest.raises(UnsupportedTypeError):
        prompts.set_admission("rollouts", max_backlog=4)


def test_admission_is_exact_for_concurrent_actors(queues, db_url: str, buffer_name: str) -> None:
    prompts, rollouts = queues
    prompts.store_prompts([prompt(i) for i in range(40)], group_size=3)
    prompts.set_admission(rollouts, batch_size=3, max_batches_ahead=2, timeout_s=0.05)
    taken: list[str] = []
    errors: list[BaseException] = []

    def actor(i: int) -> None:
        try:
            with ReplayBuffer(db_url, name=buffer_name) as mine:
                for _ in range(5):
                    try:
                        taken.extend(mine.claim(1, consumer=f"actor-{i}").ids)
                    except AdmissionTimeoutError:
                        pass
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=actor, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    # (2 + 1) * 3 = 9 completions: three prompts of three, never more, whoever claimed.
    assert len(taken) == len(set(taken)) == 3
    assert prompts.admission_stats().in_flight == 9


def test_only_completions_the_write_stored_count_towards_a_target(queues) -> None:
    prompts, rollouts = queues
    prompts.store_prompts([prompt(0)], group_size=4)
    claim = prompts.claim(1, consumer="actor")
    made = completions("p0", 4)
    made[3] = made[2].model_copy(update={"id": "p0/c3"})  # the same content as c2
    claim.ack(produce={"p0": made}, into=rollouts, dedup="skip")
    assert claim.produced.stored == 3 and claim.produced.duplicates == 1
    assert claim.unfinished == ["p0"]  # 3 of 4 stored: still short
    assert prompts.lineage(["p0"])["p0"].done == 3
    # A retry that makes c2 again (its id and content stored already) is left out too.
    again = prompts.claim(1, consumer="actor")
    assert again.needs == {"p0": 1}
    again.ack(produce={"p0": completions("p0", 1, start=2)}, into=rollouts, dedup="skip")
    assert again.unfinished == ["p0"] and prompts.lineage(["p0"])["p0"].done == 3
    last = prompts.claim(1, consumer="actor")
    last.ack(produce={"p0": completions("p0", 1, start=9)}, into=rollouts, dedup="skip")
    assert last.unfinished == [] and prompts.lineage(["p0"])["p0"].done == 4
    assert len(rollouts) == 4


def test_an_ack_whose_generations_all_failed_releases_its_prompt(queues) -> None:
    prompts, rollouts = queues
    prompts.store_prompts([prompt(0)], group_size=2)
    claim = prompts.claim(1, consumer="actor")
    assert claim.ack(produce={"p0": []}, into=rollouts) == 0
    assert claim.unfinished == ["p0"] and len(rollouts) == 0
    assert prompts.claim(1, consumer="actor").needs == {"p0": 2}
