#!/usr/bin/env python3
"""django-jaiminho 2.2.1's own relay, its `events_relay` management command in loop mode
(management/commands/events_relay.py:40-50: EventRelayer().relay(), then sleep
--loop-interval, forever; relayer.py:34-143), unmodified, with this folder's zoo_settings
(outbox-lab's database, the keep-order strategy) and zoo_task.deliver as the function each event
names. Arguments go to the command: the zoo runs `relay.py --run-in-loop --loop-interval 0.1`,
as its README advises for keep-order (`call_command(events_relay.Command(), run_in_loop=True,
loop_interval=0.1)`).

SIGTERM: jaiminho's relayer catches BaseException around each event's send (relayer.py:122),
so an exception raised by a signal handler while an event is in flight is taken for a failed
send and swallowed (keep-order: the pass ends, and the loop goes on). The handler therefore
raises SystemExit(0) only outside an event's transaction (Django's in_atomic_block), and
otherwise looks again every 50 ms (SIGALRM): the event in flight is finished and committed, and
the process exits between two events or in the loop's sleep.

A database error that ends the command (a failed COMMIT, say: it is raised outside the relayer's
per-event try) is logged, and the command is run again after a second, in this process, as a
process supervisor would restart it."""
import os
import signal
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [here]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "zoo_settings")


def _stop(signum, frame):
    from django.db import connection
    if connection.in_atomic_block:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        return
    raise SystemExit(0)


signal.signal(signal.SIGTERM, _stop)
signal.signal(signal.SIGINT, _stop)
signal.signal(signal.SIGALRM, _stop)

import time  # noqa: E402

import django  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import DatabaseError, connections  # noqa: E402

django.setup()
while True:
    try:
        call_command("events_relay", *sys.argv[1:])
        break
    except DatabaseError as e:
        # events_relay has no handler around a pass (events_relay.py:44-47): a database error
        # raised outside an event's try (a COMMIT that failed, the listing query) ends the
        # command. Run it again after a second, as a process supervisor would.
        print(f"[zoo-jaiminho] events_relay ended: {type(e).__name__}: {e}; again in 1 s",
              file=sys.stderr, flush=True)
        connections.close_all()
        time.sleep(1)
