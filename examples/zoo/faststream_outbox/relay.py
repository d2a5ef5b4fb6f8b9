#!/usr/bin/env python3
"""faststream-outbox 0.19.0's own subscriber loops (fetch loop: lease CTE with FOR UPDATE SKIP
LOCKED + LISTEN; worker loop: handler, then DELETE ... WHERE acquired_token = token) on the table
outbox_fs, queue "orders". Only the handler (hand the body to outbox-lab's sink) is ours."""
import asyncio, os, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from faststream import FastStream
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import create_async_engine
from faststream_outbox import OutboxBroker, make_outbox_table
from zoo_sink import deliver
from zoo_db import sqlalchemy_asyncpg

url, connect_args = sqlalchemy_asyncpg(os.environ["OUTBOX_LAB_DATABASE_URL"])
engine = create_async_engine(url, connect_args=connect_args)
table = make_outbox_table(MetaData(), table_name="outbox_fs")
broker = OutboxBroker(engine, outbox_table=table)

@broker.subscriber("orders", max_workers=int(os.environ.get("ZOO_WORKERS", "1")),
                   fetch_batch_size=50, min_fetch_interval=0.05, max_fetch_interval=0.5,
                   lease_ttl_seconds=float(os.environ.get("ZOO_LEASE_S", "60")))
async def relay(body: dict) -> None:
    await deliver(body)          # raises on failure -> the library's retry strategy

asyncio.run(FastStream(broker).run())
