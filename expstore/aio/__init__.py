"""expstore for asyncio code: :class:`AsyncReplayBuffer`, whose database calls are
coroutines that never block the event loop.

::

    from expstore.aio import AsyncReplayBuffer

    buffer = await AsyncReplayBuffer.open("postgresql+psycopg://...", name="rollouts")
    await buffer.extend({"task_id": ids, "agent_id": "actor-0", "step": t, "state": {...}})
    claim = await buffer.claim(64, consumer="learner", wait_s=30)
    await claim.ack(checkpoint={"step": 10})

Mechanism (see :mod:`expstore.aio.calls`): the synchronous buffer's code, on threads the
handle owns.
"""

from .buffer import AsyncReplayBuffer
from .claims import AsyncClaim, AsyncConsumer, AsyncStep

__all__ = ["AsyncClaim", "AsyncConsumer", "AsyncReplayBuffer", "AsyncStep"]
