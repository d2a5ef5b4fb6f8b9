#!/usr/bin/env python3
"""nodii-outbox-dispatcher 0.6.0's own drainer (DispatcherRunner._loop: single-active Redis lease
with a fencing token, SELECT ... FOR UPDATE SKIP LOCKED in one transaction, XADD, validate_fence,
mark dispatched_at). Ours: the wiring, and a thin redis wrapper whose xadd() spreads the library's
one `event` JSON field into the flat fields outbox-lab's stream consumer reads (event_id,
aggregate_id, ...). Everything else (lease SET/EVAL, XADD itself) goes to the real Redis."""
import asyncio, json, os, signal
import asyncpg
import redis.asyncio as aioredis
from nodii_outbox_dispatcher import define_dispatcher, start_dispatcher

class FlatFields:
    def __init__(self, r): self._r = r
    def __getattr__(self, name): return getattr(self._r, name)
    async def xadd(self, name, fields, **kw):
        env = json.loads(fields["event"])
        flat = {"event_id": env["event_id"], "aggregate_id": env["aggregate_id"],
                "aggregate_type": env["aggregate_kind"], "event_type": env["topic"],
                "payload": json.dumps(env["payload"])}
        kw.pop("maxlen", None); kw.pop("approximate", None)
        return await self._r.xadd(name, flat, **kw)

async def main():
    url = (os.environ.get("OUTBOX_LAB_SINK_URL") or os.environ["OUTBOX_LAB_REDIS_URL"]).replace("redis+unix://", "unix://", 1)
    redis = FlatFields(aioredis.from_url(url))
    pool = await asyncpg.create_pool(os.environ["OUTBOX_LAB_DATABASE_URL"], min_size=1, max_size=3)
    d = define_dispatcher(service_name="zoo", outbox_table="outbox_nodii",
                          stream_for=lambda row: f"outbox.event.{row.aggregate_kind}",
                          lease_ttl_ms=int(os.environ.get("ZOO_LEASE_MS", "2000")),
                          poll_ms=int(os.environ.get("ZOO_POLL_MS", "100")), batch_size=50,
                          drain_deadline_seconds=1)
    handle = await start_dispatcher([d], redis=redis, pg_pool=pool)
    stop = asyncio.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(s, stop.set)
    await stop.wait()
    for runner in handle.runners.values():
        await runner.stop()
    await pool.close()

asyncio.run(main())
