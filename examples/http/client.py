#!/usr/bin/env python3
"""A client of the lock service (`leasehold serve`, docs/http-api.md) using only Python's standard
library: it takes a lease, renews it while the work runs, releases it, and writes through a fence —
a store that keeps the highest token it has accepted and refuses lower ones in the same transaction
as the write, so a holder whose lease ran out (a long GC pause, a stopped VM) cannot overwrite the
work of the holder after it.

    python3 client.py demo --service http://127.0.0.1:7070 --db fenced.db [--key docs/42]

runs the whole story once and prints what happened; import it for the classes.
"""

import argparse
import json
import sqlite3
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid


class ServiceError(Exception):
    """An answer that is not what the call expects: `code` is the service's (INVALID_ARGUMENT, …)."""

    def __init__(self, status, body):
        self.status, self.code = status, body.get("code")
        super().__init__(f"{status} {body.get('code')}: {body.get('message')}")


class Busy(Exception):
    """The key stayed busy for the whole wait (409 ACQUIRE_TIMEOUT)."""


class LockService:
    def __init__(self, url, token=None, timeout_s=70):
        self.url, self.token, self.timeout_s = url.rstrip("/"), token, timeout_s

    def _call(self, method, path, body=None, headers=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            request.add_header("content-type", "application/json")
        if self.token:
            request.add_header("authorization", f"Bearer {self.token}")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                text = answer.read()
                return answer.status, json.loads(text) if text else {}
        except urllib.error.HTTPError as error:  # 4xx and 5xx answers: their JSON body says why
            text = error.read()
            return error.code, json.loads(text) if text else {}

    def acquire(self, key, ttl_ms=30_000, wait_ms=0, label=None):
        """A lease dict (lease, key, token, sequencer, ttlMs, mode), or Busy after wait_ms.

        Waits by long polls of at most 60 s, all with one Idempotency-Key: a poll that ends busy
        keeps this waiter's place in the queue for the next, and a retry after a lost answer gets
        the same grant back instead of a second lease."""
        path = f"/v1/locks/{urllib.parse.quote(key, safe='')}/acquire"
        headers = {"idempotency-key": uuid.uuid4().hex}
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            poll_ms = max(0, min(60_000, int((deadline - time.monotonic()) * 1000)))
            body = {"ttlMs": ttl_ms, "waitMs": poll_ms, **({"label": label} if label else {})}
            status, answer = self._call("POST", path, body, headers)
            if status == 200:
                return answer
            if status != 409:
                raise ServiceError(status, answer)
            if time.monotonic() >= deadline:
                raise Busy(f"{key} is held by {answer.get('holder')}")

    def renew(self, lease):
        """True while held; False once the lease is lost (410): stop writing then."""
        status, answer = self._call("POST", f"/v1/leases/{lease['lease']}/renew", {})
        if status == 410:
            return False
        if status != 200:
            raise ServiceError(status, answer)
        return True

    def release(self, lease):
        status, answer = self._call("DELETE", f"/v1/leases/{lease['lease']}")
        if status != 204:
            raise ServiceError(status, answer)

    def check(self, sequencer):
        """Chubby's CheckSequencer: {valid, key, mode, token, lastToken} — valid iff held now."""
        status, answer = self._call("POST", "/v1/sequencers/check", {"sequencer": sequencer})
        if status != 200:
            raise ServiceError(status, answer)
        return answer

    def holding(self, key, ttl_ms=30_000, wait_ms=0, label=None):
        return Holding(self, key, ttl_ms, wait_ms, label)


class Holding:
    """`with service.holding(key) as lease:` — acquired on entry, renewed every ttl/3 in a thread,
    released on exit. `lost` is set when a renewal finds the lease gone: check it between steps."""

    def __init__(self, service, key, ttl_ms, wait_ms, label):
        self.service, self.key, self.ttl_ms, self.wait_ms, self.label = service, key, ttl_ms, wait_ms, label
        self.lost, self._stop = threading.Event(), threading.Event()

    def __enter__(self):
        self.lease = self.service.acquire(self.key, self.ttl_ms, self.wait_ms, self.label)
        self._renewer = threading.Thread(target=self._renew, daemon=True)
        self._renewer.start()
        return self.lease

    def _renew(self):
        while not self._stop.wait(self.lease["ttlMs"] / 3000):
            try:
                if not self.service.renew(self.lease):
                    self.lost.set()
                    return
            except (OSError, ServiceError):
                pass  # the service is unreachable for now: the next renewal may get through before the ttl ends

    def __exit__(self, *exc):
        self._stop.set()
        self._renewer.join()
        self.service.release(self.lease)


class StaleToken(Exception):
    """The fence refused a token lower than one it already accepted: this holder's lease ran out."""


class FencedStore:
    """A SQLite file that protects itself: `marks` keeps, per resource, the highest token accepted.
    A write raises the mark and changes the data in one transaction, and only if its token is at
    least the mark — never check-then-write (a stale holder could slip in between)."""

    def __init__(self, path):
        self.db = sqlite3.connect(path, isolation_level=None)  # transactions by hand, below
        self.db.execute("CREATE TABLE IF NOT EXISTS marks (resource TEXT PRIMARY KEY, token INTEGER NOT NULL)")
        self.db.execute("CREATE TABLE IF NOT EXISTS documents (id TEXT PRIMARY KEY, body TEXT NOT NULL, token INTEGER NOT NULL)")

    def write(self, resource, token, body):
        token = int(token)  # tokens travel as decimal strings: they are 64-bit
        self.db.execute("BEGIN IMMEDIATE")  # takes the write lock now: the check and the write are one step
        try:
            self.db.execute("INSERT OR IGNORE INTO marks (resource, token) VALUES (?, 0)", (resource,))
            raised = self.db.execute("UPDATE marks SET token = ? WHERE resource = ? AND token <= ?", (token, resource, token)).rowcount
            if raised != 1:
                highest = self.db.execute("SELECT token FROM marks WHERE resource = ?", (resource,)).fetchone()[0]
                raise StaleToken(f"token {token} < {highest}")
            self.db.execute(
                "INSERT INTO documents (id, body, token) VALUES (?, ?, ?) ON CONFLICT (id) DO UPDATE SET body = excluded.body, token = excluded.token",
                (resource, body, token),
            )
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def read(self, resource):
        return self.db.execute("SELECT body, token FROM documents WHERE id = ?", (resource,)).fetchone()


def demo(service_url, db_path, key):
    service, store = LockService(service_url), FencedStore(db_path)

    # 1. A lease held longer than its ttl, kept by the renewal thread; the write goes through the fence.
    with service.holding(key, ttl_ms=1_000, label="python-demo") as lease:
        print(f"holder: token {lease['token']}")
        time.sleep(2.5)  # 2.5 ttls: only the renewals keep it
        print(f"holder: still valid after 2.5 ttls: {service.check(lease['sequencer'])['valid']}")
        store.write(key, lease["token"], "written by the holder")
        print(f"holder: wrote under token {lease['token']}")
    print("holder: released")

    # 2. The zombie: a worker whose lease runs out while it is paused, and a worker after it.
    zombie = service.acquire(key, ttl_ms=1_000, label="zombie")
    print(f"zombie: token {zombie['token']}, then paused (no renewals)")
    time.sleep(1.5)
    successor = service.acquire(key, ttl_ms=30_000, wait_ms=5_000, label="successor")
    print(f"successor: token {successor['token']}")
    store.write(key, successor["token"], "written by the successor")
    print(f"successor: wrote under token {successor['token']}")
    print(f"zombie: still valid? {service.check(zombie['sequencer'])['valid']}")
    try:
        store.write(key, zombie["token"], "written by the zombie")
        print("zombie: wrote (the fence failed!)")
    except StaleToken as refused:
        print(f"zombie: refused by the fence: {refused}")
    service.release(successor)
    body, token = store.read(key)
    print(f"document: {body!r} (token {token})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["demo"])
    parser.add_argument("--service", default="http://127.0.0.1:7070")
    parser.add_argument("--db", default="fenced.db")
    parser.add_argument("--key", default="docs/42")
    args = parser.parse_args()
    demo(args.service, args.db, args.key)
