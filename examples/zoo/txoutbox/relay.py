#!/usr/bin/env python3
"""txoutbox 0.2.2's own Relay loop (Relay.run: claim, publish key-groups, ack) on its own
PostgresStorage (table outbox_tx, LISTEN/NOTIFY wake-up), publishing to outbox-lab's sink.
Only the publisher function (zoo_sink.deliver of the row's payload) and the wiring are ours.

The main knobs are flags; a flag left out keeps txoutbox's own default (RelayConfig), so what a
run changes is on its command line, e.g. `relay.py --lease-s 1 --publish-timeout 2`.
SIGTERM: txoutbox's handle_signals=True finishes the round in flight, then run() returns."""
import argparse, asyncio, logging, os, sys
from datetime import timedelta

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from txoutbox import Relay, RelayConfig
from txoutbox.adapters.postgres import PostgresStorage
from zoo_sink import deliver

defaults = RelayConfig()
p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--batch-size", type=int, default=defaults.batch_size)
p.add_argument("--lease-s", type=float, default=defaults.lease.total_seconds(),
               help="RelayConfig.lease (txoutbox default 60)")
p.add_argument("--concurrency", type=int, default=defaults.concurrency)
p.add_argument("--publish-timeout", type=float, default=defaults.publish_timeout)
p.add_argument("--poll-max", type=float, default=defaults.poll_max,
               help="longest idle sleep between polls (LISTEN/NOTIFY cuts it short)")
p.add_argument("--max-attempts", type=int, default=defaults.max_attempts)
args = p.parse_args()


async def main() -> None:
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    storage = await PostgresStorage.connect(
        os.environ["OUTBOX_LAB_DATABASE_URL"], table="outbox_tx",
        notify_channel="outbox_tx_new", min_size=2, max_size=4)
    relay = Relay(storage, lambda m: deliver(m.payload),
                  config=RelayConfig(batch_size=args.batch_size,
                                     lease=timedelta(seconds=args.lease_s),
                                     concurrency=args.concurrency,
                                     publish_timeout=args.publish_timeout,
                                     poll_max=args.poll_max,
                                     max_attempts=args.max_attempts))
    # worker_id: txoutbox's default, host:pid:random (unique per process)
    listener = await storage.listen(relay.wake)
    try:
        await relay.run(handle_signals=True)
    finally:
        await listener.close()
        await storage.close()

asyncio.run(main())
