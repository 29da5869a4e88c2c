"""examples/python_worker.py as a real process: what SIGTERM does to streams it has just taken over."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional
from urllib.parse import parse_qs, urlsplit

import websockets
from websockets.asyncio.server import ServerConnection, serve

import leaselock
from conftest import LEASE_MS, RENEW_MS, SKEW_MS, unique, wait_for

ROOT = Path(__file__).resolve().parents[3]


class BacklogFeed:
    """A local upstream like `leaselock upstream`, one sequenced stream per path, resumable with
    `?from=SEQ`, except that every subscriber is first sent `backlog` messages at once: what a
    worker taking a stream over finds waiting after the previous owner crashed."""

    def __init__(self, backlog: int, rate: float) -> None:
        self.backlog, self.rate = backlog, rate
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: Optional[asyncio.Event] = None
        self.port = 0
        self._thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),), daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise AssertionError("the local feed did not start within 10 s")

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with serve(self._stream, "127.0.0.1", 0) as server:
            self.port = server.sockets[0].getsockname()[1]
            self._ready.set()
            await self._stop.wait()

    async def _stream(self, ws: ServerConnection) -> None:
        target = urlsplit(ws.request.path if ws.request else "/")
        stream = target.path.lstrip("/")
        seq = int(parse_qs(target.query).get("from", ["0"])[0])

        async def read_acks() -> None:
            async for _ in ws:
                pass

        reader = asyncio.create_task(read_acks())
        try:
            for i in range(10**9):
                if i >= self.backlog:
                    await asyncio.sleep(1 / self.rate)
                seq += 1
                await ws.send(json.dumps({"stream": stream, "seq": seq, "data": f"{stream}:{seq}"}))
        except websockets.ConnectionClosed:
            pass
        finally:
            reader.cancel()

    def url(self, stream: str) -> str:
        return f"ws://127.0.0.1:{self.port}/{stream}"

    def close(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def _messages_table(dynamodb: Any) -> str:
    name = unique("py-example-msgs")
    dynamodb.create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[
            {"AttributeName": "stream", "AttributeType": "S"},
            {"AttributeName": "seq", "AttributeType": "N"},
        ],
        KeySchema=[{"AttributeName": "stream", "KeyType": "HASH"}, {"AttributeName": "seq", "KeyType": "RANGE"}],
    )
    return name


def _crashed_owner(dynamodb: Any, table_name: str, id: str) -> None:
    """Leaves `id` as a crashed worker would: held by it under fence 1, expired, nothing checkpointed."""
    dynamodb.update_item(
        TableName=table_name,
        Key={"connection_id": {"S": id}},
        UpdateExpression="SET lease_owner = :o, lease_expires_at_ms = :e, fence = :one",
        ExpressionAttributeValues={
            ":o": {"S": "crashed-worker"},
            ":e": {"N": str(int(time.time() * 1000) - 10_000)},
            ":one": {"N": "1"},
        },
    )


def test_sigterm_right_after_takeovers_releases_them_at_once(dynamodb, tmp_path) -> None:
    """The example worker takes over streams whose previous owner crashed: each resumes with a
    backlog of unread messages (more than websockets' receive queue holds, so it stops reading
    the socket until the handler catches up). SIGTERM right then must release every stream
    within 2 s, as for streams that are caught up: the handlers' cancellation must not wait on
    a closing handshake the paused socket cannot complete (handler_grace is 5 s)."""
    table_name = unique("py-example")
    # A sharded orphan index: a worker that ignored LEASELOCK_ORPHAN_SHARDS would look for work
    # under `STARTED` alone and find none.
    shards = 4
    table = leaselock.LeaseTable(
        table_name, lease_ms=LEASE_MS, renew_ms=RENEW_MS, clock_skew_ms=SKEW_MS, orphan_shards=shards
    )
    table.create_table()
    messages = _messages_table(dynamodb)
    feed = BacklogFeed(backlog=2_000, rate=20)
    ids = [f"taken-{i}" for i in range(4)]
    for id in ids:
        table.start(id, feed.url(id))
        _crashed_owner(dynamodb, table_name, id)
    worker_id = unique("py-example-worker")
    env = dict(
        os.environ,
        LEASELOCK_TABLE=table_name,
        LEASELOCK_MESSAGES_TABLE=messages,
        LEASELOCK_LEASE_MS=str(LEASE_MS),
        LEASELOCK_RENEW_MS=str(RENEW_MS),
        LEASELOCK_CLOCK_SKEW_MS=str(SKEW_MS),
        LEASELOCK_ORPHAN_INTERVAL_MS="300",
        LEASELOCK_ORPHAN_SHARDS=str(shards),
        LEASELOCK_WORKER_ID=worker_id,
        PYTHONUNBUFFERED="1",
    )
    env.pop("LEASELOCK_QUEUE_URL", None)
    log_path = tmp_path / "worker.log"
    log = open(log_path, "w")
    worker = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "python_worker.py")], env=env, stdout=log, stderr=subprocess.STDOUT
    )

    def items() -> List[leaselock.LeaseItem]:
        return [table.get(id) for id in ids]  # type: ignore[misc]

    def streaming() -> bool:
        # Taken over (fence 2) and past the first message: every handler is in its stream.
        return all(i.owner == worker_id and i.fence == 2 and (i.last_seq or 0) >= 1 for i in items())

    try:
        wait_for(streaming, 30, f"the takeovers to stream (log: {log_path.read_text()[-2000:]})")
        behind = {i.id: i.last_seq for i in items()}
        os.kill(worker.pid, signal.SIGTERM)
        signalled = time.monotonic()
        released: Dict[str, float] = {}

        def all_released() -> bool:
            for i in items():
                if i.id not in released and i.expires_at_ms == 0:
                    released[i.id] = time.monotonic() - signalled
            return len(released) == len(ids)

        wait_for(all_released, 15, "every stream released after SIGTERM")
        status = worker.wait(15)
        exited = time.monotonic() - signalled
        # The handlers were still catching up (the backlog is far from drained).
        assert all(b is not None and b < 1_000 for b in behind.values()), behind
        slowest = max(released.values())
        print(f"released {slowest:.3f} s and exited {exited:.3f} s after SIGTERM, {len(ids)} takeovers at {behind}")
        assert slowest <= 2.0, f"released {released} s after SIGTERM (log: {log_path.read_text()[-2000:]})"
        assert status == 0 and exited <= 3.0, (status, exited)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
        log.close()
        feed.close()
