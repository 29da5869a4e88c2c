#!/usr/bin/env python3
"""The reference streaming worker, in Python.

Owns leased streams (through core's Rust worker), connects to each stream's ``ws_url``, resumes
after ``last_seq``, writes every message to the messages table together with the checkpoint in
one fenced transaction, and acknowledges it upstream. A takeover neither loses nor repeats a
message: the write and the resume point move together, under the lease.

Against the local feed (``leaselock upstream``) and engine::

    leaselock table create                      # lease table + messages table
    leaselock upstream --listen 127.0.0.1:9100 &
    leaselock start s1 --url ws://127.0.0.1:9100/s1
    python examples/python_worker.py            # SIGTERM / Ctrl-C: graceful hand-over

Settings come from the same environment variables as ``leaselock worker`` (LEASELOCK_TABLE,
LEASELOCK_MESSAGES_TABLE, LEASELOCK_LEASE_MS, LEASELOCK_ORPHAN_SHARDS, LEASELOCK_INDEX_NAME,
LEASELOCK_OWNER_INDEX_NAME, LEASELOCK_METRICS_NAMESPACE, LEASELOCK_INDEX_LAG_MS,
LEASELOCK_CLOCK_TOLERANCE_MS, LEASELOCK_ALLOW_EVENTUAL_GLOBAL_TABLE,
LEASELOCK_OPERATION_BUDGET_MS, ...).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import websockets

import leaselock


def env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def flag(name: str) -> bool:
    """A boolean setting as the CLI reads it (set to 1, true, yes or on)."""
    return env(name, "").lower() in ("1", "true", "yes", "on")


def optional_int(name: str) -> int | None:
    value = os.environ.get(name)
    return None if value is None else int(value)


table = leaselock.LeaseTable(
    env("LEASELOCK_TABLE", "leases"),
    lease_ms=int(env("LEASELOCK_LEASE_MS", "20000")),
    renew_ms=int(env("LEASELOCK_RENEW_MS", "5000")),
    clock_skew_ms=int(env("LEASELOCK_CLOCK_SKEW_MS", "1000")),
    key_prefix=env("LEASELOCK_KEY_PREFIX", ""),
    index_name=os.environ.get("LEASELOCK_INDEX_NAME"),
    owner_index_name=os.environ.get("LEASELOCK_OWNER_INDEX_NAME"),
    orphan_shards=int(env("LEASELOCK_ORPHAN_SHARDS", "1")),
    allow_eventual_global_table=flag("LEASELOCK_ALLOW_EVENTUAL_GLOBAL_TABLE"),
    operation_budget_ms=optional_int("LEASELOCK_OPERATION_BUDGET_MS"),
    # LEASELOCK_MODE as for `leaselock worker`: per-item (the default) or session, parsed by the
    # table as every binding parses it (a misspelt mode is refused, not run as per-item).
    mode=env("LEASELOCK_MODE", "per-item"),
)
MESSAGES = env("LEASELOCK_MESSAGES_TABLE", "leaselock-messages")
worker = leaselock.Worker(
    table,
    queue_url=os.environ.get("LEASELOCK_QUEUE_URL"),
    max_connections=int(env("LEASELOCK_MAX_CONNECTIONS", "700")),
    worker_id=os.environ.get("LEASELOCK_WORKER_ID"),
    orphan_interval_ms=int(env("LEASELOCK_ORPHAN_INTERVAL_MS", "2000")),
    desired_state_interval_ms=int(env("LEASELOCK_DESIRED_STATE_INTERVAL_MS", "10000")),
    metrics_interval_ms=int(env("LEASELOCK_METRICS_INTERVAL_MS", "60000")),
    metrics_namespace=os.environ.get("LEASELOCK_METRICS_NAMESPACE"),
    index_lag_ms=int(env("LEASELOCK_INDEX_LAG_MS", "10000")),
    clock_tolerance_ms=optional_int("LEASELOCK_CLOCK_TOLERANCE_MS"),
    wait_for_store_clock=not flag("LEASELOCK_NO_WAIT_FOR_STORE_CLOCK"),
    # Session mode balances the fleet's work unless LEASELOCK_NO_BALANCE is set (as the CLI's).
    balance=not flag("LEASELOCK_NO_BALANCE"),
)


def message_write(conn: leaselock.Connection, msg: dict) -> dict:
    """The messages table row of one (stream, seq); ``writes`` counts deliveries (duplicates show)."""
    return {
        "Update": {
            "TableName": MESSAGES,
            "Key": {"stream": {"S": conn.id}, "seq": {"N": str(msg["seq"])}},
            "UpdateExpression": "SET #data = :data, #fence = :fence, #worker = :worker, #at = :at ADD #writes :one",
            "ExpressionAttributeNames": {
                "#data": "data", "#fence": "fence", "#worker": "worker", "#at": "written_at_ms", "#writes": "writes",
            },
            "ExpressionAttributeValues": {
                ":data": {"S": msg["data"]},
                ":fence": {"N": str(conn.fence)},
                ":worker": {"S": worker.worker_id},
                # The store's clock, not this host's: stamps agree across the fleet.
                ":at": {"N": str(conn.now_ms())},
                ":one": {"N": "1"},
            },
        }
    }


@worker.handler
async def stream(conn: leaselock.Connection) -> None:
    """Streams one leased connection until the worker cancels it (deadline, lost, STOP, shutdown)."""
    if not conn.url:
        raise ValueError(f"{conn.id} has no ws_url")
    last = conn.last_seq or 0
    sep = "&" if "?" in conn.url else "?"
    target = f"{conn.url}{sep}from={last}&fence={conn.fence}"
    async with websockets.connect(target, open_timeout=5) as ws:
        print(f"{conn.id}: streaming from {last} (fence {conn.fence})", file=sys.stderr)
        try:
            async for text in ws:
                msg = json.loads(text)
                if msg["seq"] <= last:
                    continue
                if msg["seq"] != last + 1:
                    raise RuntimeError(f"upstream skipped from {last} to {msg['seq']}")
                # The message and the checkpoint land together under the lease, or not at all.
                await conn.fenced_write_with_checkpoint(msg["seq"], [message_write(conn, msg)])
                await ws.send(json.dumps({"ack": msg["seq"]}))
                last = msg["seq"]
        except asyncio.CancelledError:
            # The worker is letting the lease go and waits for this handler to end: leave now.
            # The close frame is still sent, but its answer is not awaited. A stream resumed
            # with a backlog (a takeover) has more unread messages than websockets queues
            # (max_queue), so it has stopped reading the socket and the answer could not arrive:
            # the closing handshake would hold the lease for close_timeout (10 s).
            ws.close_timeout = 0
            raise
    raise RuntimeError("upstream closed the stream")


if __name__ == "__main__":
    print(f"worker {worker.worker_id}: running", file=sys.stderr)
    snapshot = worker.run()
    print(f"worker {snapshot.worker_id}: stopped, released {snapshot.released}", file=sys.stderr)
    # Every lease is released: leave without the interpreter's finalization, which could race
    # the binding's runtime thread still returning from handing run()'s result to the loop
    # (a thread taking the GIL during finalization crashes the process).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
