"""Lease handles and hold scopes: background renewal, and cancellation on loss and STOP."""

from __future__ import annotations

import asyncio
import time

import pytest

import leaselock
from conftest import LEASE_MS, RENEW_MS, SKEW_MS, raw_item, steal, unique, wait_for


def test_lease_fields_and_deadline(table, ids) -> None:
    id = ids("fields")
    table.start(id, "wss://feed.example/f")
    before, wall_before = time.monotonic(), time.time() * 1000
    lease = table.acquire(id, "a")
    after = time.monotonic()
    assert (lease.id, lease.owner, lease.fence, lease.url) == (id, "a", 1, "wss://feed.example/f")
    assert lease.desired_state == "STARTED" and lease.last_seq is None
    # The deadline is a time.monotonic() reading (the instant Rust's Lease::deadline() and Node's
    # lease.deadline name): lease - skew after the claim was sent, so between the calls' ends
    # (core counts whole milliseconds: up to 1 ms early).
    window = (LEASE_MS - SKEW_MS) / 1000
    assert before + window - 0.002 <= lease.deadline <= after + window, (lease.deadline - before, window)
    # The stored expiry is on the (store's) wall clock: lease after the same send.
    assert lease.expires_at_ms >= wall_before + LEASE_MS - 1_000
    # time_left() is the deadline less now, in seconds as time.monotonic() counts them.
    t0 = time.monotonic()
    left = lease.time_left()
    t1 = time.monotonic()
    assert lease.deadline - t1 - 0.001 <= left <= lease.deadline - t0 + 0.001, (left, lease.deadline - t0)
    assert left > window - 1, left
    # A renewal (sent after the claim's answer came back) moves the deadline later.
    first = lease.deadline
    lease.renew()
    assert lease.deadline > first
    lease.release()


def test_lease_context_manager_releases(table, dynamodb, table_name, ids) -> None:
    id = ids("ctx")
    with table.acquire(id, "a") as lease:
        assert table.get(id).owner == "a"
    assert raw_item(dynamodb, table_name, id)["lease_expires_at_ms"] == {"N": "0"}
    assert table.acquire(id, "b").fence == lease.fence + 1


def test_sync_hold_renews_in_the_background(table, ids) -> None:
    id = ids("hold")
    with table.hold(id, "a") as lease:
        first = lease.expires_at_ms
        # Longer than the lease: only background renewals keep it.
        wait_for(lambda: time.time() * 1000 > first + RENEW_MS, 5, "one renew interval past the claim")
        time.sleep(LEASE_MS / 1000)
        assert not lease.cancelled
        item = table.get(id)
        assert (item.owner, item.fence) == ("a", 1) and item.expires_at_ms > first
        lease.checkpoint(1)
    assert table.get(id).expires_at_ms == 0


def test_sync_hold_taken_away_raises_at_the_next_lease_call(table, dynamodb, table_name, ids) -> None:
    id = ids("hold-lost")
    with table.hold(id, "a") as lease:
        steal(dynamodb, table_name, id)
        started = time.monotonic()
        wait_for(lambda: lease.cancelled, RENEW_MS / 1000 + 2, "the lost lease to be noticed")
        assert time.monotonic() - started < (LEASE_MS - SKEW_MS) / 1000
        assert lease.cancel_reason == "Lost"
        with pytest.raises(leaselock.LeaseLost):
            lease.checkpoint(1)
    assert raw_item(dynamodb, table_name, id)["lease_owner"] == {"S": "thief"}


def test_sync_hold_sees_stop(table, ids) -> None:
    id = ids("hold-stop")
    table.start(id, "wss://feed.example/s")
    with table.hold(id, "a") as lease:
        table.stop(id)
        wait_for(lambda: lease.cancelled, RENEW_MS / 1000 + 2, "STOP to be seen")
        assert lease.cancel_reason == "Stopped"
    assert table.get(id).expires_at_ms == 0


def test_async_hold_cancels_the_block_when_the_lease_is_taken(atable, dynamodb, table_name, ids) -> None:
    id = ids("ahold-lost")
    reached_end = []

    async def main() -> float:
        async with atable.hold(id, "a") as lease:
            await asyncio.to_thread(steal, dynamodb, table_name, id)
            started = time.monotonic()
            try:
                await asyncio.sleep(30)
            finally:
                elapsed = time.monotonic() - started
                assert lease.cancel_reason == "Lost"
            reached_end.append(True)
        return elapsed

    with pytest.raises(leaselock.LeaseLost):
        asyncio.run(main())
    assert reached_end == []


def test_async_hold_renews_and_releases(atable, ids) -> None:
    id = ids("ahold")

    async def main() -> None:
        async with atable.hold(id, "a") as lease:
            first = lease.expires_at_ms
            await asyncio.sleep(LEASE_MS / 1000 + 0.5)
            assert not lease.cancelled and lease.expires_at_ms > first
            await lease.checkpoint(4)
        item = await atable.get(id)
        assert (item.expires_at_ms, item.last_seq) == (0, 4)

    asyncio.run(main())


def test_async_hold_stop_raises_lease_stopped(atable, ids) -> None:
    id = ids("ahold-stop")

    async def main() -> None:
        await atable.start(id, "wss://feed.example/s")
        async with atable.hold(id, "a"):
            await atable.stop(id)
            await asyncio.sleep(30)

    started = time.monotonic()
    with pytest.raises(leaselock.LeaseStopped):
        asyncio.run(main())
    assert time.monotonic() - started < RENEW_MS / 1000 + 3


def test_hold_has_no_request_in_flight_past_its_deadline(table_name, stalling_proxy, ids) -> None:
    """Rule 2 through a store that stops answering: a checkpoint waiting on it fails as lost at
    the local deadline, the background renewal gives up by then too, and every request of the
    holder has been abandoned (its connection closed) by the deadline."""
    table = leaselock.LeaseTable(
        table_name, endpoint_url=stalling_proxy.url, lease_ms=LEASE_MS, renew_ms=RENEW_MS, clock_skew_ms=SKEW_MS
    )
    id = ids("stalled")
    with table.hold(id, "a") as lease:
        stalling_proxy.stall()
        deadline_at = lease.deadline
        with pytest.raises(leaselock.LeaseLost):
            lease.checkpoint(1)
        returned = time.monotonic()
        assert deadline_at - 0.05 <= returned <= deadline_at + 0.3, (returned - deadline_at)
        wait_for(lambda: lease.cancelled, 1, "the token at the deadline")
        assert lease.cancel_reason == "Deadline"
        held_back = wait_for(
            lambda: (lambda got: got if all(g for _, g in got) else None)(stalling_proxy.given_up_by()),
            2,
            "every held-back request to be given up",
        )
        assert held_back, "the checkpoint reached the proxy"
        for arrived, given_up in held_back:
            assert given_up is not None and given_up <= deadline_at + 0.3, (arrived, given_up, deadline_at)
        with pytest.raises(leaselock.LeaseLost):
            lease.checkpoint(2)  # refused locally: nothing is sent past the deadline
        assert len(stalling_proxy.given_up_by()) == len(held_back)
        stalling_proxy.stall(False)


def _gone_table(dynamodb, name: str) -> None:
    """Deletes the table: a request sent to it after this fails (TableNotFound)."""
    dynamodb.delete_table(TableName=name)


def test_a_scope_releases_unless_the_lease_was_lost_or_released_already(dynamodb, ids) -> None:
    """The scope's exit rule, as Node's using(): released after STOP and when the block raised;
    no request at all when the block released the lease itself or when it was lost (the table is
    deleted before the exit, so a request would fail with TableNotFound)."""
    name = unique("py-exit")
    leaselock.LeaseTable(name).create_table()
    table = leaselock.LeaseTable(name, lease_ms=LEASE_MS, renew_ms=RENEW_MS, clock_skew_ms=SKEW_MS)
    raised, stopped = ids("raised"), ids("stopped")
    with pytest.raises(RuntimeError):
        with table.hold(raised, "a"):
            raise RuntimeError("the block failed")
    assert table.get(raised).expires_at_ms == 0
    table.start(stopped, "wss://feed.example/s")
    with table.hold(stopped, "a") as lease:
        table.stop(stopped)
        wait_for(lambda: lease.cancelled, RENEW_MS / 1000 + 2, "STOP to be seen")
    assert table.get(stopped).expires_at_ms == 0

    lost, released = ids("lost"), ids("released")
    with table.hold(released, "a") as held, table.hold(lost, "a") as taken:
        held.release()
        steal(dynamodb, name, lost)
        wait_for(lambda: taken.cancel_reason == "Lost", RENEW_MS / 1000 + 2, "the lost lease to be noticed")
        _gone_table(dynamodb, name)


def test_an_async_scope_releases_as_the_blocking_one_does(dynamodb, ids) -> None:
    name = unique("py-aexit")
    leaselock.LeaseTable(name).create_table()
    table = leaselock.AsyncLeaseTable(name, lease_ms=LEASE_MS, renew_ms=RENEW_MS, clock_skew_ms=SKEW_MS)
    id = ids("released")

    async def main() -> str:
        async with table.hold(id, "a") as lease:
            await lease.release()
            await asyncio.to_thread(_gone_table, dynamodb, name)
        return "left"

    assert asyncio.run(main()) == "left"
