#!/usr/bin/env python3
"""nodii-outbox-dispatcher 0.6.0's own drainer (DispatcherRunner._loop: single-active Redis lease
with a fencing token; in one transaction SELECT ... FOR UPDATE SKIP LOCKED, then per row XADD,
validate_fence, mark dispatched_at), started by its own start_dispatcher.

Ours: the wiring, and a thin redis wrapper whose xadd() spreads the library's one `event` JSON
field into the flat fields outbox-lab's stream consumer reads (event_id, aggregate_id,
aggregate_type, event_type, payload); the stream, the MAXLEN and the XADD itself are the
library's, and every other command (the lease's SET/EVAL/GET) goes to the real client untouched.

The main define_dispatcher knobs are flags; a flag left out keeps the library's own default, so
what a run changes is on its command line, e.g. `relay.py --lease-ttl-ms 2000 --poll-ms 100`.
SIGTERM: each runner's own stop() (stop polling, wait for the batch in flight up to the drain
deadline, release the lease), then the process exits 0."""
import argparse, asyncio, inspect, json, os, signal

import asyncpg
import redis.asyncio as aioredis
from nodii_outbox_dispatcher import define_dispatcher, start_dispatcher

defaults = {k: v.default for k, v in inspect.signature(define_dispatcher).parameters.items()}
p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--lease-ttl-ms", type=int, default=defaults["lease_ttl_ms"])
p.add_argument("--poll-ms", type=int, default=defaults["poll_ms"])
p.add_argument("--batch-size", type=int, default=defaults["batch_size"])
p.add_argument("--publish-max-attempts", type=int, default=defaults["publish_max_attempts"])
p.add_argument("--drain-deadline-s", type=int, default=defaults["drain_deadline_seconds"])
args = p.parse_args()


class FlatFields:
    """The real redis client, but XADD's single `event` field spread into flat fields."""

    def __init__(self, r):
        self._r = r

    def __getattr__(self, name):
        return getattr(self._r, name)

    async def xadd(self, name, fields, **kw):
        env = json.loads(fields["event"])
        flat = {"event_id": env["event_id"], "aggregate_id": env["aggregate_id"],
                "aggregate_type": env["aggregate_kind"], "event_type": env["topic"],
                "payload": json.dumps(env["payload"])}
        return await self._r.xadd(name, flat, **kw)


async def main():
    url = (os.environ.get("OUTBOX_LAB_SINK_URL") or os.environ["OUTBOX_LAB_REDIS_URL"])
    redis = FlatFields(aioredis.from_url(url.replace("redis+unix://", "unix://", 1)))
    pool = await asyncpg.create_pool(os.environ["OUTBOX_LAB_DATABASE_URL"], min_size=1, max_size=3)
    d = define_dispatcher(service_name="zoo", outbox_table="outbox_nodii",
                          stream_for=lambda row: f"outbox.event.{row.aggregate_kind}",
                          lease_ttl_ms=args.lease_ttl_ms, poll_ms=args.poll_ms,
                          batch_size=args.batch_size,
                          publish_max_attempts=args.publish_max_attempts,
                          drain_deadline_seconds=args.drain_deadline_s)
    handle = await start_dispatcher([d], redis=redis, pg_pool=pool)
    stop = asyncio.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(s, stop.set)
    await stop.wait()
    await handle.stop()
    await pool.close()

asyncio.run(main())
