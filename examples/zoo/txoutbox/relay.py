#!/usr/bin/env python3
"""txoutbox 0.2.2's own Relay loop (claim/publish/ack) on its PostgresStorage, publishing to
outbox-lab's sink. Only the publisher function and the wiring are ours."""
import asyncio, logging, os, sys
from datetime import timedelta
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from txoutbox import Relay, RelayConfig
from txoutbox.adapters.postgres import PostgresStorage
from zoo_sink import deliver

async def main() -> None:
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    storage = await PostgresStorage.connect(
        os.environ["OUTBOX_LAB_DATABASE_URL"], table="outbox_tx",
        notify_channel="outbox_tx_new", min_size=2, max_size=4)
    lease = float(os.environ.get("ZOO_LEASE_S", "60"))
    relay = Relay(storage, lambda m: deliver(m.payload),
                  config=RelayConfig(batch_size=50, lease=timedelta(seconds=lease),
                                     publish_timeout=2.0, poll_max=0.5),
                  )  # worker_id: txoutbox default, host:pid:random (unique per process)
    listener = await storage.listen(relay.wake)
    try:
        await relay.run(handle_signals=True)
    finally:
        await listener.close()
        await storage.close()

asyncio.run(main())
