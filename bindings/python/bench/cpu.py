#!/usr/bin/env python3
"""Client CPU per renew and per acquire, side by side in one run: leaselock (blocking and
asyncio), the Rust LeaseTable itself (a separate process: bench/cpu) and boto3 sending the same
conditional UpdateItem, all against a loopback HTTP/1.1 keep-alive endpoint answering canned
DynamoDB responses (keepalive_server.py, its own process, so its CPU is not counted).

Process CPU (user + system: time.process_time() here, getrusage in the Rust binary), not wall
time; the clients take turns LEASELOCK_BENCH_ROUNDS times (5), each figure the median. Merges the
figures into bench/results/latest.json.

usage: cpu.py RUST_BENCH_BINARY [OPS]

With LEASELOCK_BENCH_BASELINE=DIR (a directory holding another build of the ``leaselock``
package), that build's figures are measured in the same run, against the same endpoint, and
printed beside this build's (not written).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, List

ROOT = Path(__file__).resolve().parents[3]
ROUNDS = int(os.environ.get("LEASELOCK_BENCH_ROUNDS", "5"))
CONCURRENT = 16


def per_op_us(op: Callable[[], object], ops: int) -> float:
    for _ in range(ops // 10):
        op()
    start = time.process_time()
    for _ in range(ops):
        op()
    return (time.process_time() - start) / ops * 1e6


async def per_op_us_awaited(op: Callable[[], "Awaitable[object]"], ops: int) -> float:
    """`per_op_us` for an awaitable operation, on the running loop."""
    for _ in range(ops // 10):
        await op()
    start = time.process_time()
    for _ in range(ops):
        await op()
    return (time.process_time() - start) / ops * 1e6


def per_op_us_async(op: Callable[[], "Awaitable[object]"], ops: int) -> float:
    return asyncio.run(per_op_us_awaited(op, ops))


def leaselock_figures(ops: int) -> Dict[str, float]:
    import leaselock

    table = leaselock.LeaseTable("bench")
    lease = table.acquire("bench", "bench-owner")
    out = {
        "python_cpu_us_per_renew": per_op_us(lease.renew, ops),
        "python_cpu_us_per_acquire": per_op_us(lambda: table.acquire("bench", "bench-owner"), ops),
    }
    atable = leaselock.AsyncLeaseTable("bench")

    async def first() -> leaselock.AsyncLease:
        return await atable.acquire("bench", "bench-owner")

    alease = asyncio.run(first())
    out["python_async_cpu_us_per_renew"] = per_op_us_async(alease.renew, ops)
    out["python_async_cpu_us_per_acquire"] = per_op_us_async(lambda: atable.acquire("bench", "bench-owner"), ops)

    # What an asyncio worker does: many leases renewing at once on one loop (a burst of
    # completions shares one wake-up of the loop).
    async def concurrent() -> float:
        leases = [await atable.acquire("bench", "bench-owner") for _ in range(CONCURRENT)]
        rounds = max(ops // CONCURRENT, 20)

        async def renew_all() -> None:
            await asyncio.gather(*(lease.renew() for lease in leases))

        return await per_op_us_awaited(renew_all, rounds) / CONCURRENT

    out[f"python_async_cpu_us_per_renew_{CONCURRENT}_concurrent"] = asyncio.run(concurrent())
    return out


def asyncio_figures(ops: int) -> Dict[str, float]:
    """Python's own cost of waiting for work done on another thread, with no leaselock in it: a
    blocking hand-off (the thread wakes the caller) and an asyncio one (the thread writes a
    socket the loop watches, whose reader resolves the awaited future), as leaselock's blocking
    and asyncio calls wait for the runtime thread. Their difference is part of what an asyncio
    call costs beyond a blocking one, whatever the client does."""
    import queue
    import threading

    work: "queue.SimpleQueue[int]" = queue.SimpleQueue()
    answered = threading.Semaphore(0)
    rx, tx = socket.socketpair()
    rx.setblocking(False)
    to_loop = [False]

    def other_thread() -> None:
        while work.get():
            if to_loop[0]:
                tx.send(b"x")
            else:
                answered.release()

    thread = threading.Thread(target=other_thread, daemon=True)
    thread.start()

    def blocking() -> None:
        work.put(1)
        answered.acquire()

    out = {"python_thread_handoff_cpu_us": per_op_us(blocking, ops)}
    to_loop[0] = True

    async def run() -> float:
        loop = asyncio.get_running_loop()
        waiting: "List[asyncio.Future[None]]" = []

        def readable() -> None:
            rx.recv(64)
            waiting.pop().set_result(None)

        loop.add_reader(rx.fileno(), readable)

        def handoff() -> "asyncio.Future[None]":
            fut = loop.create_future()
            waiting.append(fut)
            work.put(1)
            return fut

        try:
            return await per_op_us_awaited(handoff, ops)
        finally:
            loop.remove_reader(rx.fileno())

    out["python_asyncio_handoff_cpu_us"] = asyncio.run(run())
    work.put(0)
    thread.join()
    rx.close()
    tx.close()
    return out


def boto3_figures(ops: int) -> Dict[str, float]:
    """The reference worker's renewal and claim as one writes them with boto3's client."""
    import boto3

    client = boto3.client("dynamodb")

    def renew() -> object:
        now = int(time.time() * 1000)
        return client.update_item(
            TableName="bench",
            Key={"connection_id": {"S": "bench"}},
            UpdateExpression="SET lease_expires_at_ms = :exp",
            ConditionExpression="lease_owner = :me AND fence = :fence",
            ExpressionAttributeValues={":exp": {"N": str(now + 20_000)}, ":me": {"S": "bench-owner"}, ":fence": {"N": "7"}},
            ReturnValues="ALL_NEW",
        )

    def acquire() -> object:
        now = int(time.time() * 1000)
        return client.update_item(
            TableName="bench",
            Key={"connection_id": {"S": "bench"}},
            UpdateExpression="SET lease_owner = :me, lease_expires_at_ms = :exp ADD fence :one",
            ConditionExpression="(attribute_not_exists(lease_expires_at_ms) OR lease_expires_at_ms < :cutoff)"
            " AND (attribute_not_exists(desired_state) OR desired_state <> :stopped)",
            ExpressionAttributeValues={
                ":me": {"S": "bench-owner"},
                ":exp": {"N": str(now + 20_000)},
                ":one": {"N": "1"},
                ":cutoff": {"N": str(now - 1_000)},
                ":stopped": {"S": "STOPPED"},
            },
            ReturnValues="ALL_NEW",
        )

    return {"boto3_cpu_us_per_renew": per_op_us(renew, ops), "boto3_cpu_us_per_acquire": per_op_us(acquire, ops)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_figures(flag: str, ops: int, **popen: Any) -> Dict[str, float]:
    """The figures this script prints with ``flag``, measured in a process of its own."""
    out = subprocess.run([sys.executable, __file__, flag, str(ops)], check=True, capture_output=True, text=True, **popen)
    figures: Dict[str, float] = json.loads(out.stdout)
    return figures


def pinned_handoff_figures(ops: int) -> Dict[str, float]:
    """`asyncio_figures` in a process whose threads all run on one CPU: the same hand-offs
    without a wake-up crossing CPUs. Beside the unpinned figures of the same round it shows what
    a cross-CPU wake-up costs on this machine; every leaselock call (and no boto3 call) has its
    caller and the runtime thread wake each other. Only measured where the process may be pinned
    (Linux)."""
    if not hasattr(os, "sched_setaffinity"):
        return {}
    cpu = min(os.sched_getaffinity(0))
    figures = child_figures("--handoff-only", ops, preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    return {k.replace("_handoff_", "_handoff_pinned_"): v for k, v in figures.items()}


def baseline_figures(path: str, ops: int) -> Dict[str, float]:
    """The leaselock figures of the build in ``path``."""
    return child_figures("--leaselock-only", ops, env={**os.environ, "PYTHONPATH": path})


def main() -> None:
    if sys.argv[1] == "--leaselock-only":
        print(json.dumps(leaselock_figures(int(sys.argv[2]))))
        return
    if sys.argv[1] == "--handoff-only":
        print(json.dumps(asyncio_figures(int(sys.argv[2]))))
        return
    rust_bench, ops = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3_000
    baseline = os.environ.get("LEASELOCK_BENCH_BASELINE")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("keepalive_server.py")), str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        os.environ.update(
            AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
            AWS_REGION="us-east-1",
            AWS_DEFAULT_REGION="us-east-1",
            AWS_ACCESS_KEY_ID="bench",
            AWS_SECRET_ACCESS_KEY="bench",
            AWS_EC2_METADATA_DISABLED="true",
        )
        before = baseline_figures(baseline, ops) if baseline else {}
        # The clients take turns, in a rotating order, ROUNDS times; each figure is its median
        # (on a shared machine one sample can be 10% off either way).
        clients: List[Callable[[], Dict[str, float]]] = [
            lambda: leaselock_figures(ops),
            lambda: json.loads(subprocess.run([rust_bench, str(ops)], check=True, capture_output=True, text=True).stdout),
            lambda: boto3_figures(max(ops // 3, 300)),
            lambda: asyncio_figures(ops),
            lambda: pinned_handoff_figures(ops),
        ]
        samples: List[Dict[str, float]] = []
        for r in range(ROUNDS):
            sample: Dict[str, float] = {}
            for i in range(len(clients)):
                sample.update(clients[(r + i) % len(clients)]())
            samples.append(sample)
            print(f"round {r + 1}/{ROUNDS}: " + ", ".join(f"{k.replace('_cpu_us_per', '')} {v:.0f}" for k, v in sorted(sample.items())), flush=True)
    finally:
        server.terminate()
        server.wait()
    # Ratios keep three digits (the store's clock costs a few per cent of a renewal).
    figures = {k: round(statistics.median(s[k] for s in samples), 3 if "ratio" in k else 1) for k in samples[0]}
    sys.path.insert(0, str(ROOT / "bench"))
    from merge import RESULTS, merge  # the one read-update-write of latest.json every section uses

    merge(
        {
            **figures,
            "python_cpu_endpoint": "loopback HTTP/1.1 keep-alive server, canned UpdateItem responses",
            "python_cpu_method": f"process CPU per op; median of {ROUNDS} rounds in which the clients take turns",
            "python_runtime_threads": int(os.environ.get("LEASELOCK_RUNTIME_THREADS", "1")),
        }
    )

    print(f"client CPU per operation, us (process CPU, {ops} ops, keep-alive endpoint):")
    print(f"{'':18}{'renew':>8}{'acquire':>9}")
    for name, key in [("leaselock sync", "python"), ("leaselock async", "python_async"), ("Rust LeaseTable", "rust"), ("boto3", "boto3")]:
        print(f"{name:18}{figures[key + '_cpu_us_per_renew']:>8}{figures[key + '_cpu_us_per_acquire']:>9}")
    print(
        f"Rust renew on the store's clock / on the local clock, side by side: "
        f"{figures['rust_renew_store_clock_cpu_ratio']:.3f}x ({figures['rust_cpu_us_per_renew_store_clock']} / "
        f"{figures['rust_cpu_us_per_renew_local_clock']} us); answered in process (the client's CPU alone): "
        f"{figures['rust_renew_store_clock_cpu_ratio_in_process']:.3f}x"
    )
    for op in ("renew", "acquire"):
        rust_us, boto_us = figures[f"rust_cpu_us_per_{op}"], figures[f"boto3_cpu_us_per_{op}"]
        for key in ("python", "python_async"):
            us = figures[f"{key}_cpu_us_per_{op}"]
            print(f"{key} {op}: {us / rust_us:.2f}x Rust, {boto_us / us:.1f}x less than boto3")
    print(
        f"{CONCURRENT} leases renewing at once on one loop: {figures[f'python_async_cpu_us_per_renew_{CONCURRENT}_concurrent']} us "
        f"per renew; Python's own hand-off to another thread and back: {figures['python_thread_handoff_cpu_us']} us "
        f"blocking, {figures['python_asyncio_handoff_cpu_us']} us through the event loop"
        + (
            f" (with the process on one CPU: {figures['python_thread_handoff_pinned_cpu_us']} us and "
            f"{figures['python_asyncio_handoff_pinned_cpu_us']} us)"
            if "python_thread_handoff_pinned_cpu_us" in figures
            else ""
        )
    )
    if before:
        print(f"baseline build ({baseline}), same run:")
        for key, us in sorted(before.items()):
            print(f"  {key}: {us:.1f} before, {figures[key]} now")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
