"""Shared fixtures: tables on the local engine (AWS_ENDPOINT_URL, set by scripts/with-services.sh)."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any, Callable, Iterator

import boto3
import pytest

import leaselock

# Short leases: the local engine does a few hundred operations a second.
LEASE_MS, RENEW_MS, SKEW_MS = 3_000, 1_000, 500


def pytest_configure(config: Any) -> None:
    if not os.environ.get("AWS_ENDPOINT_URL"):
        raise pytest.UsageError("run under scripts/with-services.sh: AWS_ENDPOINT_URL is not set")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def table_name() -> str:
    name = unique("py-leases")
    leaselock.LeaseTable(name).create_table()
    return name


@pytest.fixture
def table(table_name: str) -> leaselock.LeaseTable:
    return leaselock.LeaseTable(table_name, lease_ms=LEASE_MS, renew_ms=RENEW_MS, clock_skew_ms=SKEW_MS)


@pytest.fixture
def atable(table_name: str) -> leaselock.AsyncLeaseTable:
    return leaselock.AsyncLeaseTable(table_name, lease_ms=LEASE_MS, renew_ms=RENEW_MS, clock_skew_ms=SKEW_MS)


@pytest.fixture(scope="session")
def dynamodb() -> Any:
    return boto3.client("dynamodb")


@pytest.fixture
def ids() -> Iterator[Callable[[str], str]]:
    """Fresh ids, unique to the test."""
    run = uuid.uuid4().hex[:8]
    yield lambda name: f"{run}-{name}"


def raw_item(dynamodb: Any, table_name: str, id: str) -> dict:
    return dynamodb.get_item(TableName=table_name, Key={"connection_id": {"S": id}}, ConsistentRead=True).get("Item", {})


def steal(dynamodb: Any, table_name: str, id: str, owner: str = "thief") -> None:
    """Rewrites the lease item behind its holder's back: a new owner and fence, far expiry."""
    dynamodb.update_item(
        TableName=table_name,
        Key={"connection_id": {"S": id}},
        UpdateExpression="SET lease_owner = :o, lease_expires_at_ms = :e ADD fence :one",
        ExpressionAttributeValues={
            ":o": {"S": owner},
            ":e": {"N": str(int(time.time() * 1000) + 600_000)},
            ":one": {"N": "1"},
        },
    )


def wait_for(cond: Callable[[], Any], timeout: float, what: str, every: float = 0.05) -> Any:
    """Polls `cond` until it is truthy; fails after `timeout` seconds."""
    until = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > until:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


class StallingProxy:
    """A TCP proxy in front of the local engine that can stop forwarding: while stalled, what a
    client sends is read and held back (never answered), and the proxy notes when each held-back
    request arrived and when its client gave the connection up."""

    def __init__(self, upstream: str) -> None:
        import socket
        import threading
        from urllib.parse import urlparse

        parsed = urlparse(upstream)
        self._upstream = (parsed.hostname, parsed.port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._stalled = False
        self._closing = False
        # connection number -> [first held-back byte at, given up at or None]
        self.held_back: dict = {}
        self._sockets: list = []
        threading.Thread(target=self._accept, daemon=True).start()

    def stall(self, on: bool = True) -> None:
        with self._lock:
            self._stalled = on

    def given_up_by(self) -> list:
        """(arrived, given up) monotonic times of every held-back request."""
        with self._lock:
            return [tuple(v) for v in self.held_back.values()]

    def close(self) -> None:
        self._closing = True
        self._listener.close()
        for s in self._sockets:
            try:
                s.close()
            except OSError:
                pass

    def _accept(self) -> None:
        import socket
        import threading

        n = 0
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._upstream)
            self._sockets += [client, upstream]
            n += 1
            threading.Thread(target=self._pump_out, args=(n, client, upstream), daemon=True).start()
            threading.Thread(target=self._pump_back, args=(upstream, client), daemon=True).start()

    def _pump_out(self, n: int, client, upstream) -> None:
        while True:
            try:
                data = client.recv(65536)
            except OSError:
                data = b""
            with self._lock:
                if not data:
                    if n in self.held_back and self.held_back[n][1] is None:
                        self.held_back[n][1] = time.monotonic()
                    break
                if self._stalled:
                    self.held_back.setdefault(n, [time.monotonic(), None])
                    continue
            try:
                upstream.sendall(data)
            except OSError:
                break
        for s in (client, upstream):
            try:
                s.close()
            except OSError:
                pass

    def _pump_back(self, upstream, client) -> None:
        while True:
            try:
                data = upstream.recv(65536)
                if not data:
                    break
                client.sendall(data)
            except OSError:
                break


@pytest.fixture
def stalling_proxy() -> Iterator[StallingProxy]:
    proxy = StallingProxy(os.environ["AWS_ENDPOINT_URL"])
    yield proxy
    proxy.close()
