#!/usr/bin/env python3
"""event-forge 1.5.0's own OutboxService processor (safety-net poll loop: release_stale_locks,
fetch_and_lock_pending with FOR UPDATE SKIP LOCKED, concurrent publish, mark_published) on its
SQLAlchemy repository. Ours: the IMessagePublisher (hand the row to outbox-lab's sink), the
poll interval, and SIGTERM."""
import asyncio, os, signal, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from event_forge.config import OutboxConfig
from event_forge.publishers.interfaces import IMessagePublisher
from event_forge.repositories.sqlalchemy.outbox_repository import SQLAlchemyOutboxRepository
from event_forge.services.outbox_service import OutboxService
from zoo_sink import deliver
from zoo_db import sqlalchemy_asyncpg

class SinkPublisher(IMessagePublisher):
    async def publish(self, message, options=None):
        await deliver({"event_id": message.id, "aggregate_id": message.aggregate_id,
                       "aggregate_type": message.aggregate_type,
                       "event_type": message.event_type, "payload": message.payload})
    def is_connected(self): return True

async def main():
    url, connect_args = sqlalchemy_asyncpg(os.environ["OUTBOX_LAB_DATABASE_URL"])
    engine = create_async_engine(url, connect_args=connect_args)
    service = OutboxService(SQLAlchemyOutboxRepository(async_sessionmaker(engine, expire_on_commit=False)),
                            SinkPublisher(),
                            OutboxConfig(safety_net_interval=float(os.environ.get("ZOO_POLL_S", "0.1")),
                                         batch_size=50,
                                         lock_timeout_seconds=int(os.environ.get("ZOO_LOCK_TIMEOUT_S", "300"))))
    stop = asyncio.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(s, stop.set)
    service.start_processor()
    await stop.wait()
    service.stop_processor()
    await engine.dispose()

asyncio.run(main())
