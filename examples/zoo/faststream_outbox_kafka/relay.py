#!/usr/bin/env python3
"""faststream-outbox 0.19.0 relaying to Kafka as its README's first quickstart ("outbox relay to
Kafka") does: FastStream's KafkaBroker publisher stacked on the library's own subscriber, run by
FastStream's own app, which connects the Kafka broker on startup. The library's fetch loop
(lease CTE with FOR UPDATE SKIP LOCKED, LISTEN outbox_outbox_fs) and worker loop (the handler,
whose return value the publisher sends to Kafka, then DELETE ... WHERE id = :id AND
acquired_token = :token) on the table outbox_fs, queue "orders". Ours: the wiring, the topic
(outbox-lab's consumer reads outbox.event.orders) and the broker's address and SASL PLAIN
credentials, from OUTBOX_LAB_KAFKA_URL.

The main subscriber knobs are flags, as in ../faststream_outbox/relay.py; a flag left out keeps
faststream-outbox's own default. --request-timeout-ms is the Kafka broker's (FastStream's
default 40000, faststream/kafka/broker/broker.py:206): a produce may wait up to twice it
(aiokafka/producer/producer.py:138-143), and that wait is the handler's, which the lease must
outlast. SIGTERM: FastStream's app stops, and the process exits 0."""
import argparse, inspect, os, sys
from urllib.parse import unquote, urlsplit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import asyncio
from faststream import FastStream
from faststream.kafka import KafkaBroker
from faststream.security import SASLPlaintext
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import create_async_engine
from faststream_outbox import OutboxBroker, make_outbox_table
from zoo_db import sqlalchemy_asyncpg_dsn

defaults = {k: v.default for k, v in inspect.signature(OutboxBroker.subscriber).parameters.items()}
p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--lease-s", type=float, default=defaults["lease_ttl_seconds"])
p.add_argument("--workers", type=int, default=defaults["max_workers"])
p.add_argument("--fetch-batch-size", type=int, default=defaults["fetch_batch_size"])
p.add_argument("--min-fetch-interval", type=float, default=defaults["min_fetch_interval"])
p.add_argument("--max-fetch-interval", type=float, default=defaults["max_fetch_interval"])
kafka_defaults = inspect.signature(KafkaBroker.__init__).parameters
p.add_argument("--request-timeout-ms", type=int, default=kafka_defaults["request_timeout_ms"].default)
args = p.parse_args()

# kafka://USER:PASSWORD@HOST:PORT: the private broker's link admits SASL PLAIN alone.
kafka = urlsplit(os.environ["OUTBOX_LAB_KAFKA_URL"])
security = None
if kafka.username:
    security = SASLPlaintext(username=unquote(kafka.username), password=unquote(kafka.password or ""))

engine = create_async_engine(sqlalchemy_asyncpg_dsn(os.environ["OUTBOX_LAB_DATABASE_URL"]))
table = make_outbox_table(MetaData(), table_name="outbox_fs")
broker_outbox = OutboxBroker(engine, outbox_table=table)
broker_kafka = KafkaBroker(f"{kafka.hostname}:{kafka.port}", security=security,
                           request_timeout_ms=args.request_timeout_ms)
publisher_kafka = broker_kafka.publisher("outbox.event.orders")


@publisher_kafka
@broker_outbox.subscriber("orders", max_workers=args.workers, fetch_batch_size=args.fetch_batch_size,
                          min_fetch_interval=args.min_fetch_interval,
                          max_fetch_interval=args.max_fetch_interval,
                          lease_ttl_seconds=args.lease_s)
async def relay(body: dict) -> dict:
    return body


asyncio.run(FastStream(broker_outbox, on_startup=[broker_kafka.connect]).run())
