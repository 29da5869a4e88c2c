"""Session mode: sessions, claims under them, takeover of a dead session's work, the one-write
end, and the Worker over a session-mode table (core's session loop)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Dict, Iterator, List, Optional

import pytest

import leaselock
from conftest import LEASE_MS, RENEW_MS, SKEW_MS, raw_item, unique, wait_for

HELD_UNDER_SESSION_MS = 32_503_680_000_000


@pytest.fixture(scope="module")
def session_table_name() -> str:
    # A table of its own: a session-mode worker claims every orphan of its table.
    name = unique("py-sessions")
    leaselock.LeaseTable(name, mode="session").create_table()
    return name


@pytest.fixture
def stable(session_table_name: str) -> leaselock.LeaseTable:
    return leaselock.LeaseTable(
        session_table_name, lease_ms=LEASE_MS, renew_ms=RENEW_MS, clock_skew_ms=SKEW_MS, mode="session"
    )


@pytest.fixture
def astable(session_table_name: str) -> leaselock.AsyncLeaseTable:
    return leaselock.AsyncLeaseTable(
        session_table_name, lease_ms=LEASE_MS, renew_ms=RENEW_MS, clock_skew_ms=SKEW_MS, mode="session"
    )


def session_item(dynamodb, table_name: str, owner: str) -> dict:
    return raw_item(dynamodb, table_name, f"session/{owner}")


def test_mode_is_item_or_session(table_name: str, table: leaselock.LeaseTable, stable) -> None:
    with pytest.raises(leaselock.InvalidInput) as e:
        leaselock.LeaseTable(table_name, mode="sessions")
    assert e.value.field == "mode"
    assert (table.mode, stable.mode) == ("per-item", "session")
    # A per-item table has no sessions: its workers would take a session's work for held forever.
    with pytest.raises(leaselock.InvalidInput) as e:
        table.create_session("w")
    assert e.value.field == "mode"
    with pytest.raises(leaselock.InvalidInput) as e:
        table.sessions()
    assert e.value.field == "mode"


def test_claim_under_a_session(stable, dynamodb, session_table_name, ids) -> None:
    id, owner = ids("claimed"), ids("owner")
    stable.start(id, f"wss://feed.example/{id}")
    session = stable.create_session(owner)
    assert session.owner == owner and session.epoch >= 1
    assert 0 < session.time_left() <= (LEASE_MS - SKEW_MS) / 1000
    lease = session.claim(id)
    assert lease.in_session and (lease.owner, lease.fence) == (owner, 1)
    item = raw_item(dynamodb, session_table_name, id)
    assert item["lease_owner"] == {"S": owner}
    assert item["session_epoch"] == {"N": str(session.epoch)}
    assert item["lease_expires_at_ms"] == {"N": str(HELD_UNDER_SESSION_MS)}
    lease.checkpoint(5)
    assert raw_item(dynamodb, session_table_name, id)["last_seq"] == {"N": "5"}

    # One session write moves the deadline of everything held under it; the item is not written.
    before = (session.expires_at_ms, lease.deadline)
    session.renew()
    assert session.expires_at_ms > before[0] and lease.deadline > before[1]
    lease.renew()  # a lease under a session renews the session
    assert raw_item(dynamodb, session_table_name, id)["lease_expires_at_ms"] == {"N": str(HELD_UNDER_SESSION_MS)}
    listed = {s.owner: s for s in stable.sessions()}
    assert listed[owner].epoch == session.epoch and listed[owner].expires_at_ms == session.expires_at_ms
    session.end()


def test_a_live_sessions_work_is_held(stable, ids) -> None:
    id = ids("held")
    stable.start(id, f"wss://feed.example/{id}")
    first, second = stable.create_session(ids("first")), stable.create_session(ids("second"))
    first.claim(id)
    with pytest.raises(leaselock.LeaseHeld) as e:
        second.claim(id)
    assert e.value.owner == first.owner and e.value.expires_at_ms == first.expires_at_ms
    # A new epoch of a live session is refused too.
    with pytest.raises(leaselock.LeaseHeld):
        stable.create_session(first.owner)
    first.end()
    second.end()


def test_takeover_after_the_session_expires(stable, dynamodb, session_table_name, ids) -> None:
    id = ids("taken")
    stable.start(id, f"wss://feed.example/{id}")
    old = stable.create_session(ids("old"))
    old_lease = old.claim(id)
    old_lease.checkpoint(3)
    new = stable.create_session(ids("new"))
    # Polled: the claim is refused while the old session lives by rule 1 (expiry + skew).
    while True:
        try:
            lease = new.claim(id)
            break
        except leaselock.LeaseHeld:
            assert time.monotonic() < old.deadline + 10, "no takeover within 10 s of the old session's deadline"
            if new.time_left() < (LEASE_MS - SKEW_MS) / 2000:
                new.renew()  # the claimer's own session must live meanwhile
            time.sleep(0.05)
    taken_at_ms = time.time() * 1000
    assert taken_at_ms >= old.expires_at_ms + SKEW_MS
    assert old.deadline < time.monotonic() and old_lease.deadline < time.monotonic()
    assert old.time_left() == 0.0 and old_lease.time_left() == 0.0
    assert (lease.owner, lease.fence, lease.last_seq) == (new.owner, old_lease.fence + 1, 3)
    after = raw_item(dynamodb, session_table_name, id)
    assert after["lease_owner"] == {"S": new.owner} and after["session_epoch"] == {"N": str(new.epoch)}

    with pytest.raises(leaselock.LeaseLost):
        old.renew()
    with pytest.raises(leaselock.LeaseLost):
        old_lease.checkpoint(4)
    with pytest.raises(leaselock.LeaseLost):
        old_lease.release()
    assert old_lease.cancelled
    assert raw_item(dynamodb, session_table_name, id) == after, "the old holder changed nothing"
    lease.checkpoint(4)
    assert raw_item(dynamodb, session_table_name, id)["last_seq"] == {"N": "4"}
    new.end()


def test_end_frees_everything_with_one_write(stable, dynamodb, session_table_name, ids) -> None:
    streams = [ids(f"s{i}") for i in range(3)]
    for id in streams:
        stable.start(id, f"wss://feed.example/{id}")
    session = stable.create_session(ids("ending"))
    leases = [session.claim(id) for id in streams]
    held = [raw_item(dynamodb, session_table_name, id) for id in streams]
    session.end()
    # The one write: the session's expiry. The items themselves are not touched.
    assert session_item(dynamodb, session_table_name, session.owner)["lease_expires_at_ms"] == {"N": "0"}
    assert [raw_item(dynamodb, session_table_name, id) for id in streams] == held
    assert {s.owner: s.expires_at_ms for s in stable.sessions()}[session.owner] == 0
    for lease in leases:
        assert lease.cancelled
        with pytest.raises(leaselock.LeaseLost):
            lease.checkpoint(1)
    with pytest.raises(leaselock.LeaseLost):
        session.claim(streams[0])
    # Free for the fleet at once (no expiry to wait out), with fence + 1.
    other = stable.create_session(ids("next"))
    for id, lease in zip(streams, leases):
        assert other.claim(id).fence == lease.fence + 1
    other.end()


def test_async_session(astable, stable, ids) -> None:
    id = ids("async")
    stable.start(id, f"wss://feed.example/{id}")

    async def main() -> None:
        session = await astable.create_session(ids("async-owner"))
        assert isinstance(session, leaselock.AsyncSession)
        lease = await session.claim(id)
        assert isinstance(lease, leaselock.AsyncLease) and lease.in_session
        await lease.checkpoint(2)
        expires = session.expires_at_ms
        await session.renew()
        assert session.expires_at_ms > expires
        rival = await astable.create_session(ids("async-rival"))
        with pytest.raises(leaselock.LeaseHeld):
            await rival.claim(id)
        listed = {s.owner: s.epoch for s in await astable.sessions()}
        assert listed[session.owner] == session.epoch
        # Many calls on one loop at once.
        await asyncio.gather(*(session.renew() for _ in range(4)))
        await session.end()
        with pytest.raises(leaselock.LeaseLost):
            await lease.checkpoint(3)
        assert (await rival.claim(id)).fence == lease.fence + 1
        await rival.end()

    asyncio.run(main())


class Seen:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fences: Dict[str, List[int]] = {}
        self.cancelled: Dict[str, List[Optional[str]]] = {}
        self.progress: Dict[str, int] = {}

    def count(self, id: str) -> int:
        with self.lock:
            return self.progress.get(id, 0)


@pytest.fixture
def serving() -> Iterator[List[leaselock.Worker]]:
    workers: List[leaselock.Worker] = []
    yield workers
    for w in workers:
        w.shutdown()


def test_worker_in_session_mode(stable, dynamodb, session_table_name, ids, serving) -> None:
    streams = [ids(f"w{i}") for i in range(3)]
    for id in streams:
        stable.start(id, f"wss://feed.example/{id}")
    worker = leaselock.Worker(
        stable,
        worker_id=ids("session-worker"),
        max_connections=10,
        orphan_interval_ms=300,
        desired_state_interval_ms=60_000,
        metrics_interval_ms=600_000,
        handler_grace_ms=1_000,
    )
    serving.append(worker)
    seen = Seen()

    @worker.handler
    async def handle(conn: leaselock.Connection) -> None:
        with seen.lock:
            seen.fences.setdefault(conn.id, []).append(conn.fence)
        seq = conn.last_seq or 0
        try:
            while True:
                await asyncio.sleep(0.2)
                seq += 1
                await conn.checkpoint(seq)
                with seen.lock:
                    seen.progress[conn.id] = seq
        finally:
            # Cancelled, or a checkpoint refused (LeaseLost) just before the cancellation landed.
            with seen.lock:
                seen.cancelled.setdefault(conn.id, []).append(conn.cancel_reason)

    thread = threading.Thread(target=lambda: asyncio.run(worker.serve()), daemon=True)
    thread.start()
    mine = [id for id in streams]
    wait_for(lambda: all(seen.count(id) > 0 for id in mine), 20, "every stream to be handled")
    session = session_item(dynamodb, session_table_name, worker.worker_id)
    epoch = int(session["fence"]["N"])
    for id in mine:
        item = raw_item(dynamodb, session_table_name, id)
        assert item["session_epoch"] == {"N": str(epoch)}
        assert item["lease_expires_at_ms"] == {"N": str(HELD_UNDER_SESSION_MS)}

    # The session is taken away behind the worker's back: a new epoch written directly.
    dynamodb.update_item(
        TableName=session_table_name,
        Key={"connection_id": {"S": f"session/{worker.worker_id}"}},
        UpdateExpression="ADD fence :one",
        ExpressionAttributeValues={":one": {"N": "1"}},
    )
    taken_at = time.monotonic()
    wait_for(
        lambda: all(seen.cancelled.get(id) for id in mine), RENEW_MS / 1000 + 2, "every handler to be cancelled"
    )
    # At its next session renewal, before the deadline the handlers had.
    assert time.monotonic() - taken_at < (LEASE_MS - SKEW_MS) / 1000
    assert all(seen.cancelled[id][0] in ("Deadline", "Lost") for id in mine)
    # The worker keeps serving: a new epoch once the rewritten one expires, its work claimed back
    # under it with fence + 1.
    wait_for(lambda: all(len(seen.fences.get(id, [])) >= 2 for id in mine), 20, "the work to be claimed back")
    for id in mine:
        assert seen.fences[id][1] == seen.fences[id][0] + 1
    assert int(session_item(dynamodb, session_table_name, worker.worker_id)["fence"]["N"]) > epoch + 1
    marks = {id: seen.count(id) for id in mine}
    wait_for(lambda: all(seen.count(id) > m for id, m in marks.items()), 10, "the handlers to keep going")

    worker.shutdown()
    thread.join(20)
    assert not thread.is_alive()
    # A graceful shutdown frees everything with the session's one write.
    assert session_item(dynamodb, session_table_name, worker.worker_id)["lease_expires_at_ms"] == {"N": "0"}
    assert all(seen.cancelled[id][-1] == "Shutdown" for id in mine)


@pytest.mark.parametrize("balance", [True, False])
def test_worker_reports_its_load_and_balances_unless_told_not_to(
    stable, dynamodb, session_table_name, ids, serving, balance
) -> None:
    streams = [ids(f"b{i}") for i in range(3)]
    for id in streams:
        stable.start(id, f"wss://feed.example/{id}")
    worker = leaselock.Worker(
        stable,
        worker_id=ids("balancing" if balance else "unbalanced"),
        max_connections=50,
        orphan_interval_ms=300,
        desired_state_interval_ms=60_000,
        metrics_interval_ms=600_000,
        balance=balance,
    )
    serving.append(worker)

    @worker.handler
    async def handle(conn: leaselock.Connection) -> None:
        await asyncio.Event().wait()

    thread = threading.Thread(target=lambda: asyncio.run(worker.serve()), daemon=True)
    thread.start()
    wait_for(lambda: set(streams) <= set(worker.snapshot().held), 20, "every stream to be held")
    # Every session renewal reports the load, with or without balance (peers count it).
    wait_for(
        lambda: session_item(dynamodb, session_table_name, worker.worker_id).get("max_connections") == {"N": "50"},
        RENEW_MS / 1000 * 3,
        "a renewal reporting the load",
    )
    snapshot = worker.snapshot()
    assert snapshot.session_epoch is not None and snapshot.handed_over == 0
    if balance:
        # Its share: everything it can see (it is the table's only live session here or not).
        wait_for(lambda: (worker.snapshot().claim_limit or 0) >= 3, 10, "a claim limit of the fleet's work")
    else:
        assert snapshot.claim_limit is None
    worker.shutdown()
    thread.join(20)
    assert not thread.is_alive()


def test_a_session_lease_is_cancelled_at_the_sessions_deadline(stable, ids) -> None:
    id, owner = ids("lapsed"), ids("owner")
    stable.start(id, f"wss://feed.example/{id}")
    session = stable.create_session(owner)
    lease = session.claim(id)
    assert not lease.cancelled and lease.time_left() > 0
    # Nobody renews the session: its leases stop at its deadline, not before and not never.
    wait_for(lambda: lease.cancelled, (LEASE_MS - SKEW_MS) / 1000 + 2, "the session's deadline")
    assert lease.cancel_reason == "Deadline"
    assert lease.deadline <= time.monotonic() and session.deadline <= time.monotonic()
    assert lease.time_left() == 0.0 and session.time_left() == 0.0
    with pytest.raises(leaselock.LeaseLost):
        lease.checkpoint(1)
    # A renewal by hand moves a session lease's deadline while it is live.
    id2 = ids("renewed")
    stable.start(id2, f"wss://feed.example/{id2}")
    session2 = stable.create_session(ids("owner2"))
    lease2 = session2.claim(id2)
    for _ in range(3):
        time.sleep(RENEW_MS / 1000)  # the pace of a holder's renewals, not a synchronization
        session2.renew()
    assert not lease2.cancelled and lease2.time_left() > 0
    session2.end()
    assert lease2.cancel_reason == "Released"
