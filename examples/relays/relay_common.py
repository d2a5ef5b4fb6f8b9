"""What the example relays share: options, logging, stopping, the database connection and
its wakeups, and the sinks. Each relay file holds only the loop of its design (one batch);
`run` drives it for ever.

Contract (see README.md): options --dsn/--sink/--batch/--mode/--interval-ms/--name, their
defaults from OUTBOX_LAB_DATABASE_URL, OUTBOX_LAB_SINK_URL, OUTBOX_LAB_RELAY_NAME; a database
error never ends the process (it reconnects, 50 ms doubling to 1 s); SIGTERM (or SIGINT)
ends it with exit status 0 in well under a second.
"""

import argparse
import contextlib
import http.client
import json
import os
import select
import signal
import sys
import time
import urllib.parse

import psycopg
from psycopg.rows import dict_row

# The article's fetch: due, undelivered rows under the attempt limit, in id order, locked for
# this transaction only (a relay that dies releases them with its connection).
FETCH = """
SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload
  FROM outbox
 WHERE published_at IS NULL AND next_attempt_at <= clock_timestamp() AND attempts < 5
 ORDER BY id LIMIT %(batch)s
   FOR UPDATE SKIP LOCKED"""

# Marks rows published; attempts counts the successful delivery too, as in the article's
# table (a row delivered on its third try reads attempts = 3).
MARK_PUBLISHED = """
UPDATE outbox SET published_at = clock_timestamp(), attempts = attempts + 1
 WHERE id = ANY(%(ids)s)"""

# Or, with --delete-published, the delivered rows go (Debezium's insert-then-delete, many
# libraries' cleanup): the outbox holds only what is still owed.
DELETE_PUBLISHED = "DELETE FROM outbox WHERE id = ANY(%(ids)s)"

NOTIFY_CHANNEL = "outbox_new"

# How long a relay asked to stop may go on finishing its batch before abandoning it.
STOP_GRACE_S = 0.5

RECONNECT_FIRST_S = 0.05
RECONNECT_MAX_S = 1.0


class Stop(BaseException):
    """Raised to end the relay (SIGTERM): not an Exception, so no handler swallows it."""


class DeliveryFailed(Exception):
    """A sink did not take an event; the message says why (it goes to last_error)."""


_name = "relay-0"


def log(message):
    """One line to stderr, prefixed with the relay's name."""
    sys.stderr.write(f"[{_name}] {message}\n")
    sys.stderr.flush()


class Stopping:
    """SIGTERM/SIGINT: raise Stop at once while the relay is waiting (between batches,
    reconnecting); during a batch, only set `requested` (the loop may finish the batch) and
    raise Stop after STOP_GRACE_S if the batch is still under way (it is then abandoned: the
    transaction rolls back when the process exits)."""

    def __init__(self):
        self.requested = False
        self._waiting = False
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGALRM, self._on_alarm)

    def _on_signal(self, signum, frame):
        if self.requested:
            return
        self.requested = True
        if self._waiting:
            raise Stop
        signal.setitimer(signal.ITIMER_REAL, STOP_GRACE_S)

    def _on_alarm(self, signum, frame):
        raise Stop

    def wait(self, seconds, conn=None, woken=None):
        """Sleeps up to `seconds`, stopping at once on SIGTERM; with a LISTENing `conn`,
        returns as soon as its socket has something to read (a notification; or an error,
        which the next batch then meets)."""
        self._waiting = True
        try:
            if self.requested:
                raise Stop
            if conn is None:
                time.sleep(seconds)
            elif not (woken and woken.pop()):
                select.select([conn.fileno()], [], [], seconds)
        finally:
            self._waiting = False

    @contextlib.contextmanager
    def waiting(self):
        """A block in which SIGTERM raises Stop at once (connecting)."""
        self._waiting = True
        try:
            if self.requested:
                raise Stop
            yield
        finally:
            self._waiting = False


def parse_args(description, extend=None):
    env = os.environ.get
    p = argparse.ArgumentParser(description=description)
    if extend:
        extend(p)  # a relay's own options
    p.add_argument("--dsn", default=env("OUTBOX_LAB_DATABASE_URL", ""),
                   help="libpq conninfo or postgres:// URL (default: $OUTBOX_LAB_DATABASE_URL, "
                        "else libpq's PGHOST/PGPORT/PGUSER/PGDATABASE)")
    p.add_argument("--sink", default=env("OUTBOX_LAB_SINK_URL"),
                   help="http://host:port[/path] (POST, default path /events) or "
                        "redis://host:port (XADD outbox.event.<aggregate_type>); "
                        "default: $OUTBOX_LAB_SINK_URL")
    p.add_argument("--batch", type=int, default=50, help="rows per transaction (default 50)")
    p.add_argument("--mode", choices=("poll", "notify"), default="poll",
                   help="after an empty batch: sleep --interval-ms (poll), or wait for a "
                        "NOTIFY on outbox_new at most --interval-ms (notify)")
    p.add_argument("--interval-ms", type=int, default=100,
                   help="poll interval, or notify's fallback timeout (default 100)")
    p.add_argument("--name", default=env("OUTBOX_LAB_RELAY_NAME") or "relay-0",
                   help="log prefix and application_name 'outbox-lab-example <name>' "
                        "(default: $OUTBOX_LAB_RELAY_NAME or relay-0)")
    p.add_argument("--delete-published", action="store_true",
                   help="delete the delivered rows instead of marking them published")
    args = p.parse_args()
    if not args.sink:
        p.error("no sink: give --sink or set OUTBOX_LAB_SINK_URL")
    sink = urllib.parse.urlsplit(args.sink)
    unix_socket = sink.scheme in ("redis+unix", "unix") and sink.path
    if not unix_socket and (sink.scheme not in ("http", "redis") or not sink.hostname):
        p.error(f"unsupported sink {args.sink!r}: give http://host:port[/path], "
                "redis://host:port or redis+unix:///path/to/socket")
    if args.batch < 1 or args.interval_ms < 0:
        p.error("--batch must be at least 1 and --interval-ms not negative")
    return args


def event_fields(row):
    """The event as it goes on the wire: the outbox row's columns by their names (the outbox
    id only from the article's table: another table's row number is not it)."""
    fields = {"id": row["id"]} if "id" in row else {}
    return fields | {
        "event_id": str(row["event_id"]),
        "aggregate_type": row["aggregate_type"],
        "aggregate_id": row["aggregate_id"],
        "event_type": row["event_type"],
        "payload": row["payload"],
    }


class HttpSink:
    """POSTs one JSON object per event on one kept-alive connection (a new one after any
    error). Delivered = a 2xx answer within the 2 s timeout."""

    def __init__(self, url):
        self.host, self.port = url.hostname, url.port or 80
        self.path = (url.path or "/events") + (f"?{url.query}" if url.query else "")
        self.conn = None

    def deliver(self, row):
        body = json.dumps(event_fields(row), separators=(",", ":")).encode()
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=2)
            self.conn.request("POST", self.path, body, {"Content-Type": "application/json"})
            response = self.conn.getresponse()
            answer = response.read()
        except Exception as e:
            self.close()
            raise DeliveryFailed(f"{type(e).__name__}: {e}") from None
        if response.will_close:
            self.close()
        if not 200 <= response.status < 300:
            text = answer[:200].decode("utf-8", "replace")
            raise DeliveryFailed(f"HTTP {response.status}: {text}")

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class RedisSink:
    """XADD outbox.event.<aggregate_type> * id .. event_id .. aggregate_type .. aggregate_id ..
    event_type .. payload <json>; an XADD that raised is a failure (redis-py
    reconnects on the next command)."""

    def __init__(self, url):
        import redis  # only needed for this sink

        # redis-py names a Unix socket unix://; outbox-lab's private Redis is redis+unix://.
        # (Its Unix socket connections take no connect timeout.)
        timeouts = {"socket_timeout": 2}
        if url.startswith(("redis+unix://", "unix://")):
            url = "unix://" + url.split("://", 1)[1]
        else:
            timeouts["socket_connect_timeout"] = 2
        self.redis = redis.Redis.from_url(url, **timeouts)

    def deliver(self, row):
        fields = event_fields(row)
        fields["payload"] = json.dumps(fields["payload"], separators=(",", ":"))
        try:
            self.redis.xadd(f"outbox.event.{row['aggregate_type']}", fields)
        except Exception as e:
            raise DeliveryFailed(f"XADD: {type(e).__name__}: {e}") from None

    def close(self):
        self.redis.close()


def open_sink(url):
    parsed = urllib.parse.urlsplit(url)
    return HttpSink(parsed) if parsed.scheme == "http" else RedisSink(url)


def connect(args):
    """A connection for batches (explicit commits); LISTENing in notify mode, with a flag
    list `woken` that gets an entry for each notification the driver reads on the way."""
    conn = psycopg.connect(args.dsn, application_name=f"outbox-lab-example {args.name}",
                           connect_timeout=2)
    woken = []
    if args.mode == "notify":
        conn.add_notify_handler(lambda notify: woken.append(True))
        conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        conn.commit()
    return conn, woken


def close_quietly(conn):
    if conn is not None:
        try:
            conn.close()
        except Exception:
            pass


def run(one_batch, design, description, extend=None):
    """Runs `one_batch(conn, cursor, sink, args, stopping)` for ever: it fetches and handles
    one batch in its transaction and returns how many rows it fetched. After an empty batch,
    waits (poll or notify); after a database error, reconnects with a backoff. Never
    returns: once stopped by SIGTERM, the process exits with status 0."""
    global _name
    args = parse_args(description, extend)
    _name = args.name
    stopping = Stopping()
    sink = open_sink(args.sink)
    log(f"{design}: sink {args.sink}, batch {args.batch}, {args.mode} every "
        f"{args.interval_ms} ms")
    conn, woken = None, None
    backoff = RECONNECT_FIRST_S
    try:
        while not stopping.requested:
            try:
                if conn is None:
                    with stopping.waiting():
                        conn, woken = connect(args)
                    log("connected")
                if woken:
                    woken.clear()  # this batch looks at whatever the notifications announced
                with conn.cursor(row_factory=dict_row) as cursor:
                    fetched = one_batch(conn, cursor, sink, args, stopping)
                backoff = RECONNECT_FIRST_S
            except psycopg.Error as e:
                first_line = (str(e).strip().splitlines() or [""])[0]
                log(f"database error ({type(e).__name__}: {first_line}); "
                    f"reconnecting in {int(backoff * 1000)} ms")
                close_quietly(conn)
                conn, woken = None, None
                stopping.wait(backoff)
                backoff = min(backoff * 2, RECONNECT_MAX_S)
                continue
            if fetched == 0:
                stopping.wait(args.interval_ms / 1000,
                              conn if args.mode == "notify" else None, woken)
    except Stop:
        pass
    finally:
        signal.signal(signal.SIGALRM, signal.SIG_IGN)  # no Stop in the middle of the cleanup
        signal.setitimer(signal.ITIMER_REAL, 0)
    close_quietly(conn)  # an unfinished transaction rolls back
    sink.close()
    log("stopped")
    # Without the interpreter's teardown, which takes ~200 ms with psycopg and redis loaded
    # on a busy machine: everything worth closing is closed.
    os._exit(0)
