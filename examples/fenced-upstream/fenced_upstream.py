#!/usr/bin/env python3
"""A fenced upstream behind the idem gateway: Python's standard library and SQLite only.

The gateway sends every request that holds a claim with the attempt's fence and number
(`Idempotency-Fence: 1733312345678901`, `Idempotency-Attempt: 2`) and removes a client's own
copies of those headers. This service keeps, per key, the highest fence it has applied, and
in ONE SQLite transaction with the business write (a payment):

- refuses a write whose fence is lower than the one stored: 409, nothing written. That is the
  late write of an attempt that was taken over (its gateway died mid-request, its request
  arrived after the retry's);
- answers the payment already made for the key, without a second one, when an earlier attempt
  made it (200; its gateway died before it could store the answer), and stores the new fence;
- else makes the payment and stores the fence (201).

So a key has at most one payment, whatever order its attempts arrive in. A write without a
key or a fence (not through the gateway's claim) is refused with 428.

    python3 fenced_upstream.py --listen 127.0.0.1:3000 --db payments.sqlite3

Routes:
    POST /payments          the write; the body is the payment (any text, kept as sent)
    GET  /payments?key=K    the payments made for key K (of this Authorization), as JSON
"""

import argparse
import json
import sqlite3
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

SCHEMA = """
CREATE TABLE IF NOT EXISTS fences (
    principal TEXT NOT NULL,
    key TEXT NOT NULL,
    fence INTEGER NOT NULL,
    PRIMARY KEY (principal, key)
);
CREATE TABLE IF NOT EXISTS payments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    principal TEXT NOT NULL,
    key TEXT NOT NULL,
    fence INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS payments_by_key ON payments (principal, key);
"""

# SQLite's INTEGER is signed 64-bit; the gateway's fences (microseconds since 1970, or more)
# stay far below this.
MAX_FENCE = 2**63 - 1


class Outcome:
    """What a write did: the status to answer and its JSON body."""

    def __init__(self, status, body):
        self.status = status
        self.body = body


def pay(db, principal, key, fence, attempt, body):
    """The fenced write: the fence check, the fence and the payment in one transaction."""
    conn = sqlite3.connect(db, timeout=30, isolation_level=None)
    try:
        # IMMEDIATE takes the write lock at once: two attempts of one key never interleave
        # between the check and the write.
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute(
                "SELECT fence FROM fences WHERE principal = ? AND key = ?", (principal, key)
            ).fetchone()
            if row is not None and fence < row[0]:
                conn.execute("ROLLBACK")
                return Outcome(
                    409,
                    {
                        "error": "stale fence: a later attempt of this key came first",
                        "key": key,
                        "fence": fence,
                        "attempt": attempt,
                        "highest_fence": row[0],
                    },
                )
            conn.execute(
                "INSERT INTO fences (principal, key, fence) VALUES (?, ?, ?) "
                "ON CONFLICT (principal, key) DO UPDATE SET fence = max(fence, excluded.fence)",
                (principal, key, fence),
            )
            paid = conn.execute(
                "SELECT id, fence, attempt FROM payments WHERE principal = ? AND key = ? "
                "ORDER BY id LIMIT 1",
                (principal, key),
            ).fetchone()
            if paid is not None:
                conn.execute("COMMIT")
                return Outcome(
                    200,
                    {
                        "payment": paid[0],
                        "key": key,
                        "fence": fence,
                        "attempt": attempt,
                        "paid_by_attempt": paid[2],
                    },
                )
            cursor = conn.execute(
                "INSERT INTO payments (principal, key, fence, attempt, body) "
                "VALUES (?, ?, ?, ?, ?)",
                (principal, key, fence, attempt, body),
            )
            conn.execute("COMMIT")
            return Outcome(
                201,
                {
                    "payment": cursor.lastrowid,
                    "key": key,
                    "fence": fence,
                    "attempt": attempt,
                    "paid_by_attempt": attempt,
                },
            )
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    finally:
        conn.close()


def payments(db, principal, key):
    """The payments made for `key`, oldest first."""
    conn = sqlite3.connect(db, timeout=30)
    try:
        rows = conn.execute(
            "SELECT id, fence, attempt, body FROM payments WHERE principal = ? AND key = ? "
            "ORDER BY id",
            (principal, key),
        ).fetchall()
    finally:
        conn.close()
    return [{"payment": r[0], "fence": r[1], "attempt": r[2], "body": r[3]} for r in rows]


def handler(settings):
    """The request handler class for `settings` (the parsed command line)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def answer(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def number(self, header, low, high):
            """The header's value as an integer in [low, high], or None."""
            value = self.headers.get(header)
            if value is None or not value.isdigit():
                return None
            value = int(value)
            return value if low <= value <= high else None

        def do_POST(self):
            length = self.number("Content-Length", 0, 1 << 20)
            if length is None:
                self.answer(411, {"error": "a Content-Length up to 1MiB is required"})
                return
            body = self.rfile.read(length).decode("utf-8", "replace")
            if urlsplit(self.path).path != "/payments":
                self.answer(404, {"error": "no such route"})
                return
            key = self.headers.get(settings.key_header)
            fence = self.number(settings.fence_header, 1, MAX_FENCE)
            attempt = self.number(settings.attempt_header, 1, 2**32 - 1)
            if not key or fence is None or attempt is None:
                self.answer(
                    428,
                    {
                        "error": f"a write needs {settings.key_header}, {settings.fence_header} "
                        f"and {settings.attempt_header}: send it through the idem gateway"
                    },
                )
                return
            principal = self.headers.get("Authorization", "")
            outcome = pay(settings.db, principal, key, fence, attempt, body)
            if "hang=1" in urlsplit(self.path).query.split("&"):
                # For the tests: the payment is made, and the answer never leaves (the process
                # is then killed, so the gateway's exchange breaks before any head).
                time.sleep(3600)
            self.answer(outcome.status, outcome.body)

        def do_GET(self):
            url = urlsplit(self.path)
            if url.path.startswith("/payments/by-key/"):
                # The gateway's reconcile request: what became of the key's payment. 200 with
                # it, or 404: no payment was made (a payment is one transaction, so there is no
                # "still running" here).
                key = unquote(url.path[len("/payments/by-key/"):])
                principal = self.headers.get("Authorization", "")
                made = payments(settings.db, principal, key)
                if made:
                    self.answer(200, {"key": key, "payment": made[0]["payment"], "reconciled": True})
                else:
                    self.answer(404, {"error": "no payment for this key"})
                return
            if url.path != "/payments":
                self.answer(404, {"error": "no such route"})
                return
            key = parse_qs(url.query).get("key", [""])[0]
            principal = self.headers.get("Authorization", "")
            self.answer(200, {"key": key, "payments": payments(settings.db, principal, key)})

        def log_message(self, format, *args):
            if not settings.quiet:
                super().log_message(format, *args)

    return Handler


class Server(ThreadingHTTPServer):
    """A thread per connection, and room for a burst of connections."""

    daemon_threads = True
    request_queue_size = 128


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", default="127.0.0.1:3000", help="HOST:PORT (port 0: any)")
    parser.add_argument("--db", default="fenced-upstream.sqlite3", help="the SQLite file")
    parser.add_argument("--key-header", default="Idempotency-Key")
    parser.add_argument("--fence-header", default="Idempotency-Fence")
    parser.add_argument("--attempt-header", default="Idempotency-Attempt")
    parser.add_argument("--quiet", action="store_true", help="no line per request")
    settings = parser.parse_args()
    host, _, port = settings.listen.rpartition(":")
    conn = sqlite3.connect(settings.db)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.executescript(SCHEMA)
    conn.close()
    server = Server((host, int(port)), handler(settings))
    bound_host, bound_port = server.server_address[:2]
    # The first line of stdout, for whoever started it on port 0.
    print(f"listening on {bound_host}:{bound_port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
