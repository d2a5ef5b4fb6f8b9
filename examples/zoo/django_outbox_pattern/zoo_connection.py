"""The broker connection django-outbox-pattern 3.2.1 publishes through, as its
DEFAULT_CONNECTION_CLASS setting names it ("The stomp.py class responsible for connecting to
the broker"): the part of stomp.py's connection its Producer calls (factories.py:11-20,
bases.py:20-39, producers.py:44-55, 82), delivering to outbox-lab's HTTP sink instead of a
STOMP broker. send() POSTs the message body (the row's `body`, JSON) and raises StompException
on any failure, the exception the library's _send_with_retry retries (producers.py:71-94)."""
import os
import urllib.request

from stomp.exception import StompException

URL = os.environ.get("OUTBOX_LAB_SINK_URL") or os.environ["OUTBOX_LAB_HTTP_URL"]
TIMEOUT_S = float(os.environ.get("ZOO_POST_TIMEOUT_S", "2"))


class SinkConnection:
    def __init__(self, host_and_ports=None, vhost=None, heartbeats=None, **_):
        self._connected = False
        self._listeners = {}

    def connect(self, username=None, passcode=None, wait=False, **_):
        self._connected = True

    def is_connected(self):
        return self._connected

    def disconnect(self, **_):
        self._connected = False

    def set_listener(self, name, listener):
        self._listeners[name] = listener

    def get_listener(self, name):
        return self._listeners.get(name)

    def remove_listener(self, name):
        self._listeners.pop(name, None)

    def send(self, destination, body, content_type=None, headers=None, **_):
        data = body.encode() if isinstance(body, str) else body
        req = urllib.request.Request(URL, data=data, method="POST",
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:  # raises on non-2xx
                r.read()
        except Exception as e:
            raise StompException(f"sink: {e}") from e
