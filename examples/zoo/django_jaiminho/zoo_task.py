"""The function django-jaiminho's relay executes for each event (what an application decorates
with @save_to_outbox): deliver one event, a JSON text, to outbox-lab's sink. The outbox row holds
a reference to it (jaiminho_event.function = dill.dumps(zoo_task.deliver), a pickle of the name
`zoo_task.deliver`) and its argument tuple (message = a pickle of (event_json,)).
A non-2xx answer, or no answer within ZOO_POST_TIMEOUT_S (default 2 s), raises."""
import os
import urllib.request

URL = os.environ.get("OUTBOX_LAB_SINK_URL") or os.environ.get("OUTBOX_LAB_HTTP_URL", "")
TIMEOUT_S = float(os.environ.get("ZOO_POST_TIMEOUT_S", "2"))


def deliver(event_json):
    data = event_json.encode() if isinstance(event_json, str) else event_json
    req = urllib.request.Request(URL, data=data, method="POST",
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:  # raises on non-2xx
        r.read()
