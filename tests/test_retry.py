"""The named back-off policies: the pauses each sleeps, when a wait gives up. Sleeping is
recorded instead of done, so nothing here depends on timing."""

from __future__ import annotations

import pytest

from expstore import _retry
from expstore._retry import (
    CLAIM_POLL,
    CONFLICT,
    RATE_LIMIT_WAIT,
    REPLICA_CATCH_UP,
    SQLITE_BUSY,
    Backoff,
)


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    pauses: list[float] = []
    monkeypatch.setattr(_retry, "sleep", pauses.append)
    return pauses


def _pauses(policy: Backoff, n: int) -> None:
    waiting = policy.start()
    for _ in range(n):
        assert waiting.sleep()


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (CONFLICT, [0.01, 0.02, 0.04, 0.08, 0.16]),
        (CLAIM_POLL, [0.005, 0.0075, 0.01125, 0.016875]),
        (RATE_LIMIT_WAIT, [0.002, 0.003, 0.0045, 0.00675]),
        (SQLITE_BUSY, [0.05, 0.05, 0.05]),
        (REPLICA_CATCH_UP, [0.001, 0.002, 0.004, 0.008]),
    ],
)
def test_each_policy_pauses_as_its_loop_did(
    slept: list[float], policy: Backoff, expected: list[float]
) -> None:
    _pauses(policy, len(expected))
    assert slept == pytest.approx(expected)


@pytest.mark.parametrize(("policy", "longest"), [(CLAIM_POLL, 0.5), (RATE_LIMIT_WAIT, 0.25)])
def test_pauses_stop_growing_at_the_longest(
    slept: list[float], policy: Backoff, longest: float
) -> None:
    _pauses(policy, 30)
    assert max(slept) == slept[-1] == longest


def test_a_wait_gives_up_after_its_attempts_or_its_timeout(slept: list[float]) -> None:
    waiting = CONFLICT.start()
    assert all(waiting.sleep() for _ in range(5))
    assert not waiting.sleep() and len(slept) == 5
    waiting = CLAIM_POLL.start(0.0)
    assert not waiting.sleep() and len(slept) == 5
    waiting = RATE_LIMIT_WAIT.start()
    waiting.timeout_s = -1.0  # a limit read again, whose timeout has passed
    assert not waiting.sleep() and waiting.pauses == 0
