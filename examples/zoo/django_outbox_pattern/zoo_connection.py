"""A stomp.py-connection-shaped class for django-outbox-pattern's Producer: send() posts the
row's body to outbox-lab's sink and raises StompException on failure, which the library's
_send_with_retry treats like a broker error."""
import json, os, urllib.request
from stomp.exception import StompException

URL = os.environ.get("OUTBOX_LAB_SINK_URL") or os.environ["OUTBOX_LAB_HTTP_URL"]

class SinkConnection:
    def __init__(self, host_and_ports=None, vhost=None, heartbeats=None, **kw):
        self._connected = False
    def connect(self, username=None, passcode=None, wait=True, **kw): self._connected = True
    def is_connected(self): return self._connected
    def disconnect(self, **kw): self._connected = False
    def set_listener(self, name, listener): pass
    def get_listener(self, name): return None
    def remove_listener(self, name): pass
    def set_ssl(self, **kw): pass
    def send(self, destination, body, headers=None, **kw):
        req = urllib.request.Request(URL, data=body.encode() if isinstance(body, str) else body,
                                     method="POST", headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=2) as r:
                r.read()
        except Exception as e:  # urllib raises on non-2xx too
            raise StompException(str(e)) from e
