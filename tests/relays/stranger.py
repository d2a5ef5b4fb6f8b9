#!/usr/bin/python3
"""A stranger's relay for the tests that hold the judge apart from the judged: the article's
relay (examples/relays), which first acts as --act says, and writes what it tried and what
became of it to --evidence (a line each), for the test to read.

  honest      the article's relay, nothing else
  autocommit  reads, delivers and marks each batch in autocommit (no BEGIN, no COMMIT: every
              statement its own transaction), as many relays do
  forge       delivers nothing and marks every row published, after trying to write the
              consumer's and the judge's records
  erase       delivers the odd ids, deletes the even ones from the outbox (and the judge's copy)
  escalate    tries what a superuser could (a shell command, dblink, ending other sessions,
              reading the orders, disabling the outbox's triggers), then relays honestly
  leftover    starts a process that leaves its group and session (setsid, a double fork) and
              outlives the relay, then relays honestly
  spy         reads every other relay's environment it can, and connects to every other
              database link it can, for a while, then relays honestly
"""

import os
import socket
import subprocess
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples", "relays"))

import psycopg  # noqa: E402

import article  # noqa: E402
import relay_common as common  # noqa: E402

ACTS = ("honest", "autocommit", "forge", "erase", "escalate", "leftover", "spy")

# The leftover's command line, for the test to look for.
LEFTOVER = ["sleep", "6001.77"]


def options(parser):
    parser.add_argument("--act", choices=ACTS, required=True)
    parser.add_argument("--evidence", required=True,
                        help="a file to append what was tried, and what became of it")
    parser.add_argument("--spy-for-s", type=float, default=3.0)


def evidence(args, line):
    with open(args.evidence, "a") as out:
        out.write(f"{args.name} {line}\n")


def attempt(args, conn, what, sql):
    """Runs `sql` in its own transaction; the evidence says `what` was refused (and why) or
    done."""
    try:
        with conn.transaction():
            cursor = conn.execute(sql)
            rows = cursor.fetchall() if cursor.description else None
        evidence(args, f"{what}: done {rows!r}")
        return rows
    except psycopg.Error as e:
        first = (str(e).strip().splitlines() or [""])[0]
        evidence(args, f"{what}: refused ({type(e).__name__}: {first})")
        return None


def sibling_database(conn, suffix):
    info = conn.info
    return {"host": info.host, "port": info.port, "user": info.user,
            "dbname": info.dbname + suffix, "connect_timeout": 2}


def forge(conn, args):
    attempt(args, conn, "write the consumer's shipments",
            "INSERT INTO consumer.shipments (order_id, event_id) "
            "SELECT aggregate_id, event_id FROM outbox")
    attempt(args, conn, "write the judge's record", "DELETE FROM judge.written")
    for what, where in [("connect to the consumer's database", sibling_database(conn, "_consumer")),
                        ("connect as the superuser", sibling_database(conn, "") | {"user": "postgres"})]:
        try:
            psycopg.connect(**where).close()
            evidence(args, f"{what}: done")
        except psycopg.Error as e:
            first = (str(e).strip().splitlines() or [""])[0]
            evidence(args, f"{what}: refused ({first})")


def escalate(conn, args):
    attempt(args, conn, "am I a superuser",
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user AND rolsuper")
    attempt(args, conn, "run a shell command", "COPY (SELECT 1) TO PROGRAM 'id'")
    attempt(args, conn, "create dblink", "CREATE EXTENSION dblink")
    attempt(args, conn, "end the other sessions",
            "SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
            "AND backend_type = 'client backend' AND NOT pg_terminate_backend(pid) IS NULL "
            "AND usename <> current_user")
    attempt(args, conn, "read the orders", "SELECT count(*) FROM orders")
    attempt(args, conn, "insert an outbox row",
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) "
            "VALUES ('orders', '1', 'Forged', '{}')")
    attempt(args, conn, "disable the outbox's triggers",
            "ALTER TABLE outbox DISABLE TRIGGER USER")
    attempt(args, conn, "read the server's files", "SELECT pg_ls_dir('.')")


def leave_a_process_behind(args):
    # The grandchild of a child that leaves at once: in a session of its own, reparented away.
    subprocess.Popen(["setsid", "--fork", *LEFTOVER], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).wait()
    evidence(args, "left a process behind")


def spy(args):
    """For --spy-for-s: every other relay's environment it can read (its database password,
    its broker's token), another uid's or its own run's, and every database link it can
    connect to, another run's or its own run's."""
    me, mine = os.getpid(), os.environ.get("PGHOST", "")
    deadline = time.monotonic() + args.spy_for_s
    read, siblings, reached, own = set(), set(), set(), set()
    while time.monotonic() < deadline:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            if int(pid) == me:
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if b"OUTBOX_LAB_RELAY_NAME" in f.read():
                        same = os.stat(f"/proc/{pid}").st_uid == os.getuid()
                        (siblings if same else read).add(pid)
            except OSError:
                continue
        for entry in os.listdir("/tmp"):
            link = os.path.join("/tmp", entry)
            if not entry.startswith("outbox-lab-pg-link-"):
                continue
            for port in range(6000, 6010):
                path = os.path.join(link, f".s.PGSQL.{port}")
                with socket.socket(socket.AF_UNIX) as s:
                    try:
                        s.connect(path)
                        (own if link == mine else reached).add(path)
                    except OSError:
                        pass
        time.sleep(0.05)
    evidence(args, f"other users' relays' environments read: {len(read)}")
    evidence(args, f"its own run's relays' environments read: {len(siblings)}")
    evidence(args, f"other database links reached: {len(reached)}")
    evidence(args, f"its own run's database links reached: {len(own)}")


def main():
    done = set()

    def one_batch(conn, cursor, sink, args, stopping):
        if args.act not in done:
            done.add(args.act)
            if args.act == "forge":
                forge(conn, args)
            elif args.act == "escalate":
                escalate(conn, args)
            elif args.act == "leftover":
                leave_a_process_behind(args)
            elif args.act == "spy":
                spy(args)
        if args.act == "forge":
            cursor.execute("UPDATE outbox SET published_at = clock_timestamp() "
                           "WHERE published_at IS NULL")
            conn.commit()
            return 0
        if args.act == "erase":
            return erase(conn, cursor, sink, args)
        if args.act == "autocommit":
            return autocommit(conn, sink, args)
        return article.one_batch(conn, cursor, sink, args, stopping)

    common.run(one_batch, "a stranger's relay", __doc__, options)


def erase(conn, cursor, sink, args):
    rows = cursor.execute(common.FETCH, {"batch": args.batch}).fetchall()
    odd = [row for row in rows if row["id"] % 2 == 1]
    even = [row["id"] for row in rows if row["id"] % 2 == 0]
    try:
        for row in odd:
            sink.deliver(row)
    except common.DeliveryFailed:
        conn.rollback()
        return 0
    cursor.execute(common.MARK_PUBLISHED, {"ids": [row["id"] for row in odd]})
    cursor.execute("DELETE FROM outbox WHERE id = ANY(%(ids)s)", {"ids": even})
    conn.commit()
    if even and "judge" not in args.__dict__.setdefault("tried", set()):
        args.tried.add("judge")
        attempt(args, conn, "erase the judge's copy", "DELETE FROM judge.written")
    return len(rows)


def autocommit(conn, sink, args):
    """Each statement its own implicit transaction: the fetch takes no lock, the mark commits
    by itself (the relay is the only one)."""
    conn.commit()
    conn.autocommit = True
    try:
        rows = conn.execute(
            "SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload "
            "FROM outbox WHERE published_at IS NULL ORDER BY id LIMIT %(batch)s",
            {"batch": args.batch}, prepare=False).fetchall()
        for row in rows:
            try:
                sink.deliver(dict(zip(
                    ("id", "event_id", "aggregate_type", "aggregate_id", "event_type",
                     "payload"), row)))
            except common.DeliveryFailed:
                return 0  # retried at the next batch
            conn.execute("UPDATE outbox SET published_at = clock_timestamp() WHERE id = %s",
                         (row[0],))
        return len(rows)
    finally:
        conn.autocommit = False


if __name__ == "__main__":
    main()
