"""Shared sink for the zoo adapters: hand one event (a JSON object with at least event_id and
aggregate_id) to outbox-lab's sink named by OUTBOX_LAB_SINK_URL (else OUTBOX_LAB_HTTP_URL).
http(s)://  -> one POST per event, 2xx = delivered (raises otherwise)
redis://, redis+unix:///path -> XADD outbox.event.<aggregate_type> * field value ... (needs redis-py)
"""
import asyncio, json, os, urllib.request

URL = os.environ.get("OUTBOX_LAB_SINK_URL") or os.environ["OUTBOX_LAB_HTTP_URL"]
_redis = None

def _post(body: bytes) -> None:
    req = urllib.request.Request(URL, data=body, method="POST",
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=2) as r:  # raises on non-2xx
        r.read()

async def deliver(event) -> None:
    """event: dict, or JSON bytes/str of one."""
    global _redis
    if isinstance(event, (bytes, str)):
        event = json.loads(event)
    if URL.startswith("http"):
        await asyncio.to_thread(_post, json.dumps(event).encode())
        return
    import redis.asyncio as aioredis
    if _redis is None:
        url = URL.replace("redis+unix://", "unix://", 1)
        _redis = aioredis.from_url(url)
    fields = {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in event.items()}
    await _redis.xadd(f"outbox.event.{event.get('aggregate_type', 'orders')}", fields)
