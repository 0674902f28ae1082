"""How many events per second the audit writer commits with many concurrent appenders.

For the access scenario (``bench.access``), not a test: the number depends on the disk (SQLite
fsyncs every group commit) and the database server. The schema must exist; the events are
appended to whatever log the engine points at. Moved out of ``gateway.audit``: benchmark code
does not ship in the product.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.audit import AuditEvent, AuditPrincipal, AuditWriter, new_event_id

__all__ = ["measure_throughput", "sample_event"]


def sample_event(i: int) -> AuditEvent:
    """A typical completed-inference event (metadata only)."""
    return AuditEvent(
        event_id=new_event_id(),
        ts=datetime.now(UTC),
        kind="inference.completed",
        outcome="success",
        request_id=f"req-{i}",
        principal=AuditPrincipal(key_id=f"key{i % 17}", team=f"team{i % 5}", method="api_key"),
        action="chat.completions",
        model="gemma-3-270m",
        deployment="llamacpp-0",
        route="/v1/chat/completions",
        http_status=200,
        prompt_tokens=42,
        completion_tokens=128,
        latency_ms=812.5,
        ttft_ms=35.25,
        finish_reason="stop",
        sampling={"temperature": 0.7, "top_p": 0.95, "max_tokens": 256, "stream": True},
        request_bytes=1234,
        response_bytes=5678,
        policy_version="0123456789abcdef",
        decision="allowed",
    )


async def measure_throughput(engine: AsyncEngine, n: int, *, concurrency: int = 256) -> float:
    """Events per second for `n` strict appends from `concurrency` tasks (checkpoints included)."""
    events = [sample_event(i) for i in range(n)]
    async with AuditWriter(engine, signing_key=Ed25519PrivateKey.generate()) as writer:

        async def appender(k: int) -> None:
            for event in events[k::concurrency]:
                await writer.append(event)

        started = time.perf_counter()
        await asyncio.gather(*(appender(k) for k in range(concurrency)))
        elapsed = time.perf_counter() - started
    return n / elapsed if elapsed > 0 else float("inf")
