"""LeaseTable and AsyncLeaseTable against the local engine: the lease rules seen from Python."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, List

import pytest

import leaselock
from conftest import LEASE_MS, SKEW_MS, raw_item, unique, wait_for

CLAIMERS, ROUNDS = 16, 50


def test_sixteen_threads_fifty_rounds_one_winner_each(table, ids) -> None:
    id = ids("contended")
    barrier = threading.Barrier(CLAIMERS)
    wins: List[List[Any]] = [[] for _ in range(ROUNDS)]
    held = [0] * ROUNDS
    errors: List[BaseException] = []

    def claimer(n: int) -> None:
        try:
            for r in range(ROUNDS):
                barrier.wait()
                try:
                    wins[r].append(table.acquire(id, f"c{n}"))
                except leaselock.LeaseHeld:
                    held[r] += 1
                barrier.wait()
                for lease in wins[r] if n == 0 else []:
                    lease.release()
                barrier.wait()
        except BaseException as e:  # surfaced below
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(CLAIMERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert [len(w) for w in wins] == [1] * ROUNDS
    assert held == [CLAIMERS - 1] * ROUNDS
    # Every round's claim bumped the fence once.
    assert [w[0].fence for w in wins] == list(range(1, ROUNDS + 1))


def test_sixteen_coroutines_fifty_rounds_one_winner_each(atable, ids) -> None:
    id = ids("contended-async")

    async def claim(n: int) -> Any:
        try:
            return await atable.acquire(id, f"c{n}")
        except leaselock.LeaseHeld:
            return None

    async def main() -> List[int]:
        fences = []
        for _ in range(ROUNDS):
            got = [l for l in await asyncio.gather(*(claim(n) for n in range(CLAIMERS))) if l is not None]
            assert len(got) == 1, got
            fences.append(got[0].fence)
            await got[0].release()
        return fences

    assert asyncio.run(main()) == list(range(1, ROUNDS + 1))


def _expired_takeover(table, id: str, old) -> Any:
    """Claims `id` as "b" as soon as it may; checks no claim lands before expiry + skew."""
    def attempt() -> Any:
        try:
            return table.acquire(id, "b")
        except leaselock.LeaseHeld:
            return None

    new = wait_for(attempt, LEASE_MS / 1000 + 3, "the takeover", every=0.1)
    assert time.time() * 1000 > old.expires_at_ms + SKEW_MS
    return new


def test_takeover_after_expiry_and_skew_fences_the_old_owner(table, dynamodb, table_name, ids) -> None:
    id = ids("takeover")
    old = table.acquire(id, "a")
    old.checkpoint(7)
    new = _expired_takeover(table, id, old)
    assert (new.fence, new.last_seq, new.owner) == (old.fence + 1, 7, "b")
    before = raw_item(dynamodb, table_name, id)
    for op in (old.renew, lambda: old.checkpoint(8), old.release):
        with pytest.raises(leaselock.LeaseLost):
            op()
    assert raw_item(dynamodb, table_name, id) == before


def test_takeover_async(atable, table, dynamodb, table_name, ids) -> None:
    id = ids("takeover-async")

    async def main() -> None:
        old = await atable.acquire(id, "a")
        await old.checkpoint(3)
        new = await asyncio.to_thread(_expired_takeover, table, id, old)
        assert (new.fence, new.last_seq) == (old.fence + 1, 3)
        before = raw_item(dynamodb, table_name, id)
        for op in (old.renew, lambda: old.checkpoint(4), old.release):
            with pytest.raises(leaselock.LeaseLost):
                await op()
        assert raw_item(dynamodb, table_name, id) == before

    asyncio.run(main())


def test_checkpoint_only_moves_forward(table, atable, ids) -> None:
    id = ids("seq")
    lease = table.acquire(id, "a")
    lease.checkpoint(5)
    for stale in (5, 3):
        with pytest.raises(leaselock.SeqNotIncreasing) as e:
            lease.checkpoint(stale)
        assert (e.value.last_seq, e.value.seq) == (5, stale)
    lease.checkpoint(6)
    assert table.get(id).last_seq == 6 and lease.last_seq == 6

    async def main() -> None:
        alease = await atable.acquire(ids("seq-async"), "a")
        await alease.checkpoint(2)
        with pytest.raises(leaselock.SeqNotIncreasing):
            await alease.checkpoint(2)
        await alease.checkpoint(9)
        assert (await atable.get(alease.id)).last_seq == 9

    asyncio.run(main())


def test_orphans_over_many_items(table_name) -> None:
    name = unique("py-orphans")
    t = leaselock.LeaseTable(name, lease_ms=LEASE_MS, renew_ms=1_000, clock_skew_ms=SKEW_MS)
    t.create_table()
    ids = [f"o{n:03}" for n in range(270)]
    for id in ids:
        t.start(id, f"wss://feed.example/{id}")
    for id in ids[:15]:
        t.acquire(id, "busy")
    orphans = t.orphans()
    assert sorted(o.id for o in orphans) == ids[15:]
    assert len(orphans) == 255
    assert all(o.desired_state == "STARTED" for o in orphans)
    expiries = [o.expires_at_ms or 0 for o in orphans]
    assert expiries == sorted(expiries)
    assert len(t.orphans(limit=100)) == 100

    a = leaselock.AsyncLeaseTable(name, lease_ms=LEASE_MS, renew_ms=1_000, clock_skew_ms=SKEW_MS)

    async def main() -> None:
        assert len(await a.orphans()) == 255
        assert len(await a.orphans(limit=7)) == 7
        states = await a.desired_states(ids[:3] + ["never-started"])
        assert states == {ids[0]: "STARTED", ids[1]: "STARTED", ids[2]: "STARTED", "never-started": None}
        assert sorted(i.id for i in await a.owned_by("busy")) == ids[:15]

    asyncio.run(main())
    assert sorted(i.id for i in t.owned_by("busy")) == ids[:15]


def _field(call) -> str:
    with pytest.raises(leaselock.InvalidInput) as e:
        call()
    return e.value.field


def test_bad_input_names_the_field_and_writes_nothing(table, atable, dynamodb, table_name, ids) -> None:
    id = ids("bad")
    assert _field(lambda: table.start("", "wss://feed.example/a")) == "id"
    assert _field(lambda: table.start(id, "http://feed.example/a")) == "url"
    assert _field(lambda: table.acquire(id, "")) == "owner"
    assert _field(lambda: table.acquire("x" * 1025, "a")) == "id"
    assert _field(lambda: asyncio.run(atable.start(id, "feed"))) == "url"
    assert _field(lambda: asyncio.run(atable.acquire(id, ""))) == "owner"
    assert raw_item(dynamodb, table_name, id) == {}
    lease = table.acquire(id, "a")
    before = raw_item(dynamodb, table_name, id)
    assert _field(lambda: lease.checkpoint(-1)) == "seq"
    assert raw_item(dynamodb, table_name, id) == before
    lease.release()


def test_mode_is_named_as_the_cli_names_it_and_item_is_an_alias() -> None:
    assert leaselock.LeaseTable("leases").mode == "per-item"
    assert leaselock.LeaseTable("leases", mode="item").mode == "per-item"
    assert leaselock.AsyncLeaseTable("leases", mode="session").mode == "session"


def test_bad_settings_name_the_argument(table) -> None:
    new = lambda **kw: leaselock.LeaseTable("leases", **kw)  # noqa: E731
    assert _field(lambda: new(mode="per_item")) == "mode"  # "per-item" (or "item") or "session"
    assert _field(lambda: leaselock.AsyncLeaseTable("leases", mode="shard")) == "mode"
    assert _field(lambda: new(lease_ms=1_000, clock_skew_ms=1_000)) == "lease_ms"
    assert _field(lambda: new(renew_ms=0)) == "renew_ms"
    assert _field(lambda: new(clock_skew_ms=0)) == "clock_skew_ms"
    assert _field(lambda: new(lease_ms=-5)) == "lease_ms"
    assert _field(lambda: leaselock.LeaseTable("x")) == "table_name"
    assert _field(lambda: new(attributes={"bogus": "b"})) == "attributes"  # the key is the caller's text, quoted in the message
    assert _field(lambda: new(attributes={"fence": "lease_owner"})) == "attributes.fence"
    assert _field(lambda: leaselock.Worker(table, max_connections=0)) == "max_connections"
    assert _field(lambda: leaselock.Worker(table, worker_id="")) == "worker_id"
    assert _field(lambda: new(operation_budget_ms=0)) == "operation_budget_ms"
    assert _field(lambda: new(operation_attempt_timeout_ms=0)) == "operation_attempt_timeout_ms"
    assert _field(lambda: new(operation_budget_ms="10s")) == "operation_budget_ms"


def test_the_operation_budget_is_settable_as_in_rust_node_and_the_cli() -> None:
    """operation_budget_ms bounds a call that holds no lease: against an endpoint nothing
    listens on, a read gives up within its budget, not the default 10 s."""
    assert leaselock.LeaseTable("leases").operation_budget_ms == 10_000
    assert leaselock.LeaseTable("leases").operation_attempt_timeout_ms == 5_000
    table = leaselock.LeaseTable(
        "leases", endpoint_url="http://127.0.0.1:9", operation_budget_ms=600, operation_attempt_timeout_ms=200
    )
    assert (table.operation_budget_ms, table.operation_attempt_timeout_ms) == (600, 200)
    started = time.monotonic()
    with pytest.raises(leaselock.StoreError):
        table.get("s1")
    assert time.monotonic() - started < 5, "gave up within its budget"


def test_sharded_orphan_index_lists_every_shard_and_refuses_bad_counts(dynamodb) -> None:
    name = unique("py-shards")
    t = leaselock.LeaseTable(name, lease_ms=LEASE_MS, renew_ms=1_000, clock_skew_ms=SKEW_MS, orphan_shards=8)
    assert t.orphan_shards == 8
    t.create_table()
    ids = [f"s{n:02}" for n in range(40)]
    for id in ids:
        t.start(id, f"wss://feed.example/{id}")
    values = {raw_item(dynamodb, name, id)["desired_state"]["S"] for id in ids}
    assert values == {f"STARTED#{k}" for k in range(8)}, values
    assert all(t.get(id).desired_state == "STARTED" for id in ids[:3])
    t.acquire(ids[0], "busy")
    assert sorted(o.id for o in t.orphans()) == ids[1:]
    assert len(t.orphans(limit=5)) == 5
    # An unsharded view of the same table reads `STARTED` alone: none of them.
    assert leaselock.LeaseTable(name, lease_ms=LEASE_MS, renew_ms=1_000, clock_skew_ms=SKEW_MS).orphans() == []
    assert leaselock.LeaseTable(name).orphan_shards == 1
    for bad in (0, 257):
        assert _field(lambda: leaselock.LeaseTable(name, orphan_shards=bad)) == "orphan_shards"


class RecordedDynamoDB:
    """A loopback DynamoDB answering each request from ``answer(operation, nth)`` -> (status,
    body): recorded answers of what the local engine cannot make (a global table's description,
    another Region's write conflict). ``asked`` lists the operations, in order."""

    def __init__(self, answer: Any) -> None:
        import http.server
        import json

        recorded = self
        self.asked: List[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (the server's name for it)
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                operation = self.headers.get("X-Amz-Target", "").rsplit(".", 1)[-1]
                nth = recorded.asked.count(operation)
                recorded.asked.append(operation)
                status, body = answer(operation, nth)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.0")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


REPLICAS = [{"RegionName": "us-east-1", "ReplicaStatus": "ACTIVE"}, {"RegionName": "eu-west-1", "ReplicaStatus": "ACTIVE"}]


def global_table(consistency: Any) -> dict:
    table = {"TableName": "leases", "TableStatus": "ACTIVE", "Replicas": REPLICAS}
    if consistency is not None:
        table["MultiRegionConsistency"] = consistency
    return {"Table": table}


REFUSED = (
    "invalid table: leases is a global table in multi-Region eventual consistency (replicas: us-east-1, eu-west-1), "
    "where concurrent writes in two Regions resolve last-writer-wins, so a lease on it is not exclusive across "
    "Regions; use a single-Region table or a multi-Region strong consistency (MRSC) global table, or, if every "
    "writer of this table writes in one Region, opt in with allow_eventual_global_table "
    "(LEASELOCK_ALLOW_EVENTUAL_GLOBAL_TABLE=1)"
)


@pytest.mark.parametrize("consistency", ["EVENTUAL", None])
def test_an_eventually_consistent_global_table_is_refused_before_any_claim(consistency: Any) -> None:
    def answer(operation: str, nth: int) -> Any:
        assert operation == "DescribeTable", f"nothing but DescribeTable may be sent, got {operation}"
        return 200, global_table(consistency)

    server = RecordedDynamoDB(answer)
    try:
        table = leaselock.LeaseTable("leases", endpoint_url=server.url, region="us-east-1")
        with pytest.raises(leaselock.InvalidInput) as refused:
            table.check_table()
        assert str(refused.value) == REFUSED
        assert refused.value.field == "table"
        for claim in (lambda: table.acquire("s1", "a"), lambda: table.hold("s1", "a").__enter__()):
            with pytest.raises(leaselock.InvalidInput, match="not exclusive across Regions"):
                claim()

        worker = leaselock.Worker(table, metrics_interval_ms=60_000)

        @worker.handler
        async def handle(conn: leaselock.Connection) -> None:
            raise AssertionError("nothing may be claimed")

        with pytest.raises(leaselock.InvalidInput, match="LEASELOCK_ALLOW_EVENTUAL_GLOBAL_TABLE=1"):
            asyncio.run(asyncio.wait_for(worker.serve(), 10))
        assert set(server.asked) == {"DescribeTable"}
    finally:
        server.close()


def test_a_strongly_consistent_global_table_is_accepted_and_its_write_conflicts_retried() -> None:
    conflict = {
        "__type": "com.amazonaws.dynamodb.v20120810#ReplicatedWriteConflictException",
        "message": "The request was rejected because one or more items in the request are being modified by a "
        "request in another Region.",
    }
    claimed = {
        "Attributes": {
            "connection_id": {"S": "s1"},
            "lease_owner": {"S": "a"},
            "fence": {"N": "1"},
            "lease_expires_at_ms": {"N": str(int(time.time() * 1000) + 20_000)},
        }
    }

    def answer(operation: str, nth: int) -> Any:
        if operation == "DescribeTable":
            return 200, global_table("STRONG")
        assert operation == "UpdateItem", operation
        return (400, conflict) if nth < 2 else (200, claimed)

    server = RecordedDynamoDB(answer)
    try:
        table = leaselock.LeaseTable("leases", endpoint_url=server.url, region="us-east-1")
        assert table.check_table() == "strong"
        lease = table.acquire("s1", "a")
        assert (lease.owner, lease.fence) == ("a", 1)
        assert server.asked == ["DescribeTable", "UpdateItem", "UpdateItem", "UpdateItem"], "described once"
    finally:
        server.close()


def test_the_opt_in_and_a_local_engine_table(table_name) -> None:
    local = leaselock.LeaseTable(table_name)
    assert local.check_table() == "single-region"
    assert not local.allow_eventual_global_table
    opted = leaselock.LeaseTable("leases", endpoint_url="http://127.0.0.1:9", allow_eventual_global_table=True)
    assert opted.check_table() == "not-checked", "nothing is sent (nothing listens there)"
    assert asyncio.run(leaselock.AsyncLeaseTable(table_name).check_table()) == "single-region"
    with pytest.raises(leaselock.TableNotFound):
        leaselock.LeaseTable(unique("py-missing")).check_table()


def test_index_names_are_the_ones_given(dynamodb) -> None:
    """Both index names are settable: create_table makes them, and session mode's work is listed
    through the owner index so named (a table whose owner index has another name would fail)."""
    from conftest import unique

    name = unique("py-index-names")
    table = leaselock.LeaseTable(name, mode="session", index_name="orphans", owner_index_name="by-owner")
    table.create_table()
    described = dynamodb.describe_table(TableName=name)["Table"]
    assert sorted(i["IndexName"] for i in described["GlobalSecondaryIndexes"]) == ["by-owner", "orphans"]
    table.start("s1", "wss://feed.example/s1")
    session = table.create_session("w1")
    session.claim("s1")
    assert [i.id for i in table.owned_by("w1")] == ["s1"]
