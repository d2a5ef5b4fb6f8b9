#!/usr/bin/env python3
"""faststream-outbox 0.19.0's own subscriber loops, run by FastStream's own app: the fetch loop
(lease CTE with FOR UPDATE SKIP LOCKED, LISTEN outbox_outbox_fs) and the worker loop(s) (the
handler, then DELETE ... WHERE id = :id AND acquired_token = :token, or the retry strategy's
UPDATE) on the table outbox_fs, queue "orders". Ours: the handler (hand the body to
outbox-lab's sink) and the wiring.

The main subscriber knobs are flags; a flag left out keeps faststream-outbox's own default
(@broker.subscriber's), so what a run changes is on its command line, e.g.
`relay.py --lease-s 1 --fetch-batch-size 20`. SIGTERM: FastStream's app stops the broker,
whose subscriber drains the rows it holds (within graceful_timeout), and the process exits 0."""
import argparse, asyncio, inspect, os, sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from faststream import FastStream
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import create_async_engine
from faststream_outbox import OutboxBroker, make_outbox_table
from zoo_sink import deliver
from zoo_db import sqlalchemy_asyncpg_dsn

defaults = {k: v.default for k, v in inspect.signature(OutboxBroker.subscriber).parameters.items()}
p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--lease-s", type=float, default=defaults["lease_ttl_seconds"])
p.add_argument("--workers", type=int, default=defaults["max_workers"])
p.add_argument("--fetch-batch-size", type=int, default=defaults["fetch_batch_size"])
p.add_argument("--min-fetch-interval", type=float, default=defaults["min_fetch_interval"])
p.add_argument("--max-fetch-interval", type=float, default=defaults["max_fetch_interval"])
p.add_argument("--terminal-flush-batch-size", type=int,
               default=defaults["terminal_flush_batch_size"])
args = p.parse_args()

# The URL in asyncpg's own dsn form: every session (the engine's, and the raw LISTEN
# connection the fetch loop opens from engine.url) is named relay-N.
engine = create_async_engine(sqlalchemy_asyncpg_dsn(os.environ["OUTBOX_LAB_DATABASE_URL"]))
table = make_outbox_table(MetaData(), table_name="outbox_fs")
broker = OutboxBroker(engine, outbox_table=table)


@broker.subscriber("orders", max_workers=args.workers, fetch_batch_size=args.fetch_batch_size,
                   min_fetch_interval=args.min_fetch_interval,
                   max_fetch_interval=args.max_fetch_interval,
                   lease_ttl_seconds=args.lease_s,
                   terminal_flush_batch_size=args.terminal_flush_batch_size)
async def relay(body: dict) -> None:
    await deliver(body)          # raises on failure -> the library's retry strategy


asyncio.run(FastStream(broker).run())
