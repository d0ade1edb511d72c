"""A sampler of your own, written against expstore's public sampler primitives alone.

``LongMessagesSampler`` favours rows whose conversation is long: a matching row with ``n``
messages is drawn, with replacement, with probability proportional to ``1 + min(n, cap)``
(rows without messages still have a chance; past ``cap`` messages a row gains no more).
It is one method, ``choose_flat``, written against a ``KeySpace``:

- over the database's key space, candidate keys drawn uniformly from the buffer's key
  range are probed for their messages (one indexed lookup each) and kept with probability
  ``(1 + min(n, cap)) / (1 + cap)``: exact rejection sampling, whose cost does not grow
  with the buffer (``draw_uniform`` does the rounds and gives up when too few candidates
  match, e.g. under a narrow condition);
- when it gives up, the same method runs over the matching rows' key index held in memory,
  where ``draw_uniform`` draws in proportion to the same chances by their cumulative sum,
  kept (under ``name``) while the buffer is unchanged.

Nothing here touches SQL, the storage's modules or expstore's private names: a new
sampler is a new module of your own.

    python examples/long_messages_sampler.py            # an in-memory buffer
    python examples/long_messages_sampler.py --db sqlite:///long.db --rows 20000
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from typing import Any

import numpy as np

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer
from expstore.query import QueryCondition
from expstore.samplers import Choice, KeySampler, KeySpace, UniformSampler, draw_uniform

MESSAGES = "exp_data.messages"


class LongMessagesSampler(KeySampler):
    """Rows in proportion to ``1 + min(len(messages), cap)``, with replacement.

    ``LongMessagesSampler(cap=16, *, seed=None, max_staleness=None, consume_after=None)``
    """

    columns = (MESSAGES,)

    def __init__(self, cap: int = 16, **options: Any) -> None:
        super().__init__(**options)
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
            raise ValueError(f"cap must be an int of at least 1, got {cap!r}")
        self.cap = cap

    def weight(self, messages: np.ndarray) -> np.ndarray:
        """Each row's weight from its messages (a list, or None for none)."""
        counts = np.fromiter(
            (len(m) if isinstance(m, list) else 0 for m in messages),
            dtype=np.float64,
            count=len(messages),
        )
        return 1.0 + np.minimum(counts, self.cap)

    def choose_flat(
        self, space: KeySpace, batch_size: int, query_condition: QueryCondition
    ) -> Choice | None:
        top = 1.0 + self.cap

        def accept(columns: dict[str, np.ndarray]) -> np.ndarray:
            return self.weight(columns[MESSAGES]) / top

        drawn = draw_uniform(
            space,
            batch_size,
            self.rng,
            columns=(MESSAGES,),
            accept=accept,
            hint=self.kept_hint(query_condition),
            name=f"long:{self.cap}",  # what accept depends on besides the messages
        )
        if drawn is None:
            return None  # over the database: too few candidates matched; the index serves
        self.kept_hint(query_condition, drawn.kept)
        return Choice(drawn.keys)


def conversation(turns: int) -> list[dict[str, str]]:
    return [
        {"role": "user" if t % 2 == 0 else "assistant", "content": f"turn {t}"}
        for t in range(turns)
    ]


def rows_with_messages(n: int, seed: int = 0) -> list[DataRow]:
    """``n`` rows of 8 tasks whose conversations have 0 to 15 messages."""
    rng = np.random.default_rng(seed)
    return [
        DataRow(
            exp_meta=ExpMeta(task_id=f"task{i % 8}", agent_id=f"agent{i % 2}", step=i // 8),
            exp_data=Experience(
                state={"i": i}, reward_t=float(i % 5), messages=conversation(int(rng.integers(16)))
            ),
        )
        for i in range(n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=None, help="a database URL (default: in memory)")
    parser.add_argument("--rows", type=int, default=4000)
    args = parser.parse_args()
    with ReplayBuffer(args.db, name="long-messages") as buffer:
        if len(buffer) < args.rows:
            buffer.store_batch(rows_with_messages(args.rows - len(buffer)))
        for sampler in (UniformSampler(seed=0), LongMessagesSampler(cap=15, seed=0)):
            started = time.perf_counter()
            drawn = [r for _ in range(20) for r in buffer.sample(sampler, batch_size=256)]
            took = (time.perf_counter() - started) / 20
            lengths = [len(r.exp_data.messages or []) for r in drawn]
            print(
                f"{type(sampler).__name__}: mean messages {np.mean(lengths):.2f} "
                f"({took * 1000:.1f} ms per batch of 256)"
            )
        top = Counter(lengths).most_common(1)[0][0]
        print(f"long conversations come first: the most drawn length is {top}")


if __name__ == "__main__":
    main()
