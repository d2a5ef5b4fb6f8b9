#!/usr/bin/env python3
"""pactix 0.2.0's own WakeupRunner loop (LISTEN outbox_wake + fallback poll; each pass
OutboxRunner.run_once: reclaim expired leases, claim with FOR UPDATE SKIP LOCKED and a per
(event_type, ordering_key) FIFO gate, publish outside any transaction, mark in a new one) with its
own HttpOutboxPublisher. Ours: the wiring (sink URL as the endpoint for every event type) and
SIGTERM. Needs Python >= 3.12."""
import asyncio, os, signal, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from datetime import timedelta
from sqlalchemy.ext.asyncio import create_async_engine
from zoo_db import sqlalchemy_asyncpg
from pactix import PactixConfig, WakeupPolicy, NotifyMode, OutboxStore, OutboxRunner, PublisherRegistry, WakeupRunner
from pactix.transport.http.publisher import HttpOutboxPublisher, HttpEndpointRouter, HttpEndpoint, HttpxRequestClient

async def main():
    url, connect_args = sqlalchemy_asyncpg(os.environ["OUTBOX_LAB_DATABASE_URL"])
    engine = create_async_engine(url, connect_args=connect_args)
    policy = WakeupPolicy(enabled=True, notify_mode=NotifyMode.TRIGGER,
                          fallback_initial_interval=timedelta(milliseconds=100),
                          fallback_max_interval=timedelta(milliseconds=500))
    config = PactixConfig(outbox_batch_size=50, wakeup=policy,
                          lease_duration=timedelta(seconds=float(os.environ.get("ZOO_LEASE_S", "30"))))
    router = HttpEndpointRouter()
    await router.register("orders", HttpEndpoint("POST", os.environ.get("OUTBOX_LAB_SINK_URL") or os.environ["OUTBOX_LAB_HTTP_URL"]))
    registry = PublisherRegistry()
    await registry.register_all(HttpOutboxPublisher(HttpxRequestClient(), router))
    task = asyncio.create_task(WakeupRunner(OutboxRunner(OutboxStore(config), registry), policy).run(engine))
    stop = asyncio.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(s, stop.set)
    await stop.wait()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await engine.dispose()

asyncio.run(main())
