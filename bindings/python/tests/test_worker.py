"""The Worker: core's runtime drives Python handlers; cancellation reaches them as CancelledError."""

from __future__ import annotations

import asyncio
import inspect
import json
import subprocess
import sys
import threading
import time
from typing import Dict, Iterator, List, Optional

import pytest

import leaselock
from conftest import LEASE_MS, RENEW_MS, SKEW_MS, raw_item, steal, wait_for


def _worker(table, **kw) -> leaselock.Worker:
    kw.setdefault("orphan_interval_ms", 300)
    kw.setdefault("desired_state_interval_ms", 60_000)
    kw.setdefault("handler_grace_ms", 1_000)
    return leaselock.Worker(table, max_connections=10, metrics_interval_ms=600_000, **kw)


class Seen:
    """What each handler did, written from the loop thread, read from the test thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: Dict[str, float] = {}
        self.cancelled: Dict[str, Optional[str]] = {}
        self.progress: Dict[str, int] = {}

    def count(self, id: str) -> int:
        with self.lock:
            return self.progress.get(id, 0)


_serving: List[leaselock.Worker] = []


def _serve_in_thread(worker: leaselock.Worker) -> threading.Thread:
    thread = threading.Thread(target=lambda: asyncio.run(worker.serve()), daemon=True)
    thread.start()
    _serving.append(worker)
    return thread


@pytest.fixture(autouse=True)
def _no_worker_outlives_its_test() -> Iterator[None]:
    # The tests share a table: a worker left running would claim the next test's work.
    yield
    while _serving:
        _serving.pop().shutdown()


def test_lost_lease_cancels_only_that_handler(table, dynamodb, table_name, ids) -> None:
    streams = [ids(n) for n in ("a", "b", "c")]
    for id in streams:
        table.start(id, f"wss://feed.example/{id}")
    taken = streams[1]
    worker = _worker(table)
    seen = Seen()

    @worker.handler
    async def handle(conn: leaselock.Connection) -> None:
        with seen.lock:
            seen.started[conn.id] = time.monotonic()
        seq = conn.last_seq or 0
        try:
            while True:
                await asyncio.sleep(0.2)
                seq += 1
                # The taken one makes no lease call: only the worker's renewal can notice.
                if conn.id != taken:
                    await conn.checkpoint(seq)
                with seen.lock:
                    seen.progress[conn.id] = seq
        except asyncio.CancelledError:
            with seen.lock:
                seen.cancelled[conn.id] = conn.cancel_reason
            raise

    thread = _serve_in_thread(worker)
    wait_for(lambda: all(seen.count(id) > 0 for id in streams), 15, "every stream to be handled")
    steal(dynamodb, table_name, taken)
    stolen_at = time.monotonic()
    wait_for(lambda: taken in seen.cancelled, RENEW_MS / 1000 + 2, "the handler to be cancelled")
    # Cancelled before the deadline it had when the item was rewritten.
    assert time.monotonic() - stolen_at < (LEASE_MS - SKEW_MS) / 1000
    assert seen.cancelled[taken] == "Lost"
    # The others keep streaming and are not disturbed.
    marks = {id: seen.count(id) for id in (streams[0], streams[2])}
    wait_for(lambda: all(seen.count(id) > m + 3 for id, m in marks.items()), 10, "the others to keep going")
    assert set(seen.cancelled) == {taken}
    assert raw_item(dynamodb, table_name, taken)["lease_owner"] == {"S": "thief"}
    assert taken not in worker.snapshot().held
    worker.shutdown()
    thread.join(20)
    assert not thread.is_alive()
    assert seen.cancelled[streams[0]] == "Shutdown" and seen.cancelled[streams[2]] == "Shutdown"
    for id in (streams[0], streams[2]):
        assert table.get(id).expires_at_ms == 0
    snap = worker.snapshot()
    assert snap.leases_lost >= 1 and snap.released >= 2


def test_raising_and_loop_blocking_handlers_do_not_hold_leases(table, dynamodb, table_name, ids) -> None:
    boom, stuck, calm = ids("boom"), ids("stuck"), ids("calm")
    for id in (boom, stuck, calm):
        table.start(id, f"wss://feed.example/{id}")
    worker = _worker(table, orphan_interval_ms=2_000)
    seen = Seen()
    blocking = threading.Event()
    after_block: List[BaseException] = []

    @worker.handler
    async def handle(conn: leaselock.Connection) -> None:
        with seen.lock:
            seen.progress[conn.id] = seen.progress.get(conn.id, 0) + 1
        if conn.id == boom:
            raise ValueError("handler bug")
        if conn.id == stuck and not blocking.is_set():
            await asyncio.sleep(0.5)
            blocking.set()
            table.stop(stuck)
            # Blocks the whole event loop, far past the lease's deadline.
            time.sleep((LEASE_MS + 2_000) / 1000)
            try:
                await conn.checkpoint(1)
            except BaseException as e:
                after_block.append(e)
            return
        await asyncio.sleep(3600)

    thread = _serve_in_thread(worker)
    wait_for(blocking.is_set, 15, "the blocking handler")
    blocked_at = time.monotonic()
    # While the loop is stuck: STOP cancels the lease in Rust, the grace runs out, the lease is
    # released: the stuck handler does not keep it.
    wait_for(lambda: table.get(stuck).expires_at_ms == 0, LEASE_MS / 1000, "the stuck handler's lease to go")
    assert time.monotonic() - blocked_at < (LEASE_MS + 2_000) / 1000, "released only after the loop unblocked"
    # The calm connection's lease is still renewed meanwhile.
    calm_expiry = table.get(calm).expires_at_ms
    wait_for(lambda: table.get(calm).expires_at_ms > calm_expiry, RENEW_MS / 1000 + 2, "calm to be renewed")
    wait_for(lambda: after_block, 10, "the handler to wake up")
    assert isinstance(after_block[0], (leaselock.LeaseLost, asyncio.CancelledError)), after_block
    # The raising handler was released and re-claimed; the worker is still up.
    wait_for(lambda: worker.snapshot().handler_errors >= 2, 15, "the failing handler to be retried")
    assert calm in worker.snapshot().held and thread.is_alive()
    assert table.get(calm).owner == worker.worker_id
    worker.shutdown()
    thread.join(20)
    assert not thread.is_alive()
    assert table.get(calm).expires_at_ms == 0


def test_handler_decorator_and_serve_cancellation(table, ids) -> None:
    id = ids("serve")
    table.start(id, f"wss://feed.example/{id}")
    worker = _worker(table)

    async def main() -> None:
        started = asyncio.Event()

        @worker.handler
        async def handle(conn: leaselock.Connection) -> None:
            assert conn.fence >= 1 and conn.url == f"wss://feed.example/{id}" and conn.time_left() > 0
            started.set()
            await asyncio.sleep(3600)

        serving = asyncio.create_task(worker.serve())
        await asyncio.wait_for(started.wait(), 15)
        serving.cancel()
        try:
            await serving
        except asyncio.CancelledError:
            pass

    asyncio.run(main())
    # Cancelling serve() shut the worker down cleanly: the lease was released.
    assert table.get(id).expires_at_ms == 0


def test_hints_from_the_queue_claim_at_once(table, ids) -> None:
    import boto3

    sqs = boto3.client("sqs")
    queue_url = sqs.create_queue(QueueName=ids("hints"))["QueueUrl"]
    id = ids("hinted")
    # The orphan index is polled once at start and then only every minute: the hint does it.
    worker = _worker(table, queue_url=queue_url, orphan_interval_ms=60_000, hint_wait_ms=1_000)
    claimed = threading.Event()

    @worker.handler
    async def handle(conn: leaselock.Connection) -> None:
        claimed.set()
        await asyncio.sleep(3600)

    thread = _serve_in_thread(worker)
    wait_for(lambda: worker.snapshot().orphan_polls >= 1, 10, "the first orphan poll")
    table.start(id, f"wss://feed.example/{id}")
    sqs.send_message(QueueUrl=queue_url, MessageBody='{"connection_id":"%s"}' % id)
    assert claimed.wait(10), "the hinted work was not claimed"
    # The claim can land before the counter moves (the hint also wakes the orphan poll).
    wait_for(lambda: worker.snapshot().hints_received >= 1, 10, "the hint to be counted")
    worker.shutdown()
    thread.join(20)
    assert table.get(id).expires_at_ms == 0


def test_unreachable_store_cancels_at_the_deadline(ids, tmp_path) -> None:
    """An engine of the test's own, frozen with SIGSTOP: no renewal can land, so the handler is
    cancelled (Deadline) at the local deadline of the last renewal, not later."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import urllib.request
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parents[3]
    log = open(tmp_path / "engine.log", "w")
    engine = subprocess.Popen(
        [sys.executable, str(root / "scripts" / "local_engine.py"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=1)
            return True
        except OSError:
            return False

    try:
        wait_for(answers, 30, "the test's own engine")
        table = leaselock.LeaseTable(
            "py-deadline", endpoint_url=url, lease_ms=LEASE_MS, renew_ms=RENEW_MS, clock_skew_ms=SKEW_MS
        )
        table.create_table()
        id = ids("frozen")
        table.start(id, f"wss://feed.example/{id}")
        worker = _worker(table)
        conns: List[leaselock.Connection] = []
        cancelled: Dict[str, object] = {}

        @worker.handler
        async def handle(conn: leaselock.Connection) -> None:
            conns.append(conn)
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError as e:
                cancelled.update(reason=conn.cancel_reason, at=time.monotonic(), message=str(e))
                raise

        thread = _serve_in_thread(worker)
        wait_for(lambda: conns, 15, "the claim")
        # Freeze the store once a renewal has landed (the item's expiry moved past the claim's).
        def expiry() -> int:
            item = table.get(id)
            return (item.expires_at_ms or 0) if item is not None else 0

        claimed = expiry()
        wait_for(lambda: expiry() > claimed, LEASE_MS / 1000, "a renewal")
        os.kill(engine.pid, signal.SIGSTOP)
        time.sleep(0.2)
        deadline_at = conns[0].deadline
        wait_for(lambda: cancelled, LEASE_MS / 1000 + 1, "the deadline cancellation")
        assert cancelled["reason"] == "Deadline" and cancelled["message"] == "Deadline"
        assert cancelled["at"] <= deadline_at + 0.3, cancelled["at"] - deadline_at
        assert cancelled["at"] >= deadline_at - 0.3, deadline_at - cancelled["at"]
        os.kill(engine.pid, signal.SIGCONT)
        worker.shutdown()
        thread.join(30)
        assert not thread.is_alive()
    finally:
        os.kill(engine.pid, signal.SIGCONT)
        engine.terminate()
        engine.wait(10)
        log.close()


_MEASURED = """
import asyncio, json, sys, threading, leaselock
table = leaselock.LeaseTable(sys.argv[1], lease_ms=3_000, renew_ms=1_000, clock_skew_ms=500)
table.start(sys.argv[2], "wss://feed.example/x")
worker = leaselock.Worker(table, max_connections=1, orphan_interval_ms=200, metrics_interval_ms=600_000)
handled = threading.Event()

@worker.handler
async def handle(conn):
    handled.set()
    await asyncio.sleep(3600)

thread = threading.Thread(target=lambda: asyncio.run(worker.serve()), daemon=True)
thread.start()
assert handled.wait(20), "the stream was not handled"
snap = worker.snapshot()
worker.shutdown()
thread.join(20)
table.stop(sys.argv[2])  # not left for the next test's workers
print(json.dumps([snap.clock_offset_ms, snap.clock_uncertainty_ms, snap.claims_paused]))
"""


def test_the_store_clock_is_measured_and_in_the_snapshot_and_the_metrics_line(table_name, ids) -> None:
    run = subprocess.run(
        [sys.executable, "-c", _MEASURED, table_name, ids("measured")], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    *metrics, last = run.stdout.splitlines()
    offset, uncertainty, paused = json.loads(last)
    # Claimed only once the store's clock was known within half the skew; the local engine
    # runs on this host's clock, so the offset is within what was measured.
    assert paused is None and uncertainty <= 250 and abs(offset) <= uncertainty + 2, last
    emf = json.loads(metrics[-1])
    names = [m["Name"] for m in emf["_aws"]["CloudWatchMetrics"][0]["Metrics"]]
    assert "ClockOffsetMs" in names and "ClockUncertaintyMs" in names, names
    assert isinstance(emf["ClockOffsetMs"], int) and abs(emf["ClockOffsetMs"]) <= emf["ClockUncertaintyMs"] + 2, emf


def test_the_keyword_defaults_are_cores() -> None:
    """Worker's keyword defaults are core's (the Rust builder's and Node's are the same values)."""
    defaults = leaselock._native.WORKER_DEFAULTS
    params = inspect.signature(leaselock.Worker).parameters
    for name in (
        "max_connections",
        "orphan_interval_ms",
        "desired_state_interval_ms",
        "metrics_interval_ms",
        "handler_grace_ms",
        "hint_wait_ms",
        "index_lag_ms",
        "balance",
        "wait_for_store_clock",
    ):
        assert params[name].default == getattr(defaults, name), name
    shown = (defaults.max_connections, defaults.orphan_interval_ms, defaults.hint_wait_ms, defaults.metrics_namespace)
    assert shown == (700, 2_000, 5_000, "leaselock")
