"""Leader election from Python, on the lease table (local engine) and on the local Redis."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Tuple

import pytest
from conftest import LEASE_MS, RENEW_MS, SKEW_MS, steal

import leaselock
from leaselock import LeaderElector, Term

BACKENDS = ["dynamodb", "redis"]


def redis_url() -> str:
    url = os.environ.get("LEASELOCK_REDIS_URL")
    if not url:
        # Under `make test` (LEASELOCK_REQUIRE_SERVICES) or CI a missing Redis is a failure.
        if os.environ.get("LEASELOCK_REQUIRE_SERVICES") or os.environ.get("CI"):
            pytest.fail("LEASELOCK_REDIS_URL is not set: run under scripts/with-services.sh")
        pytest.skip("no Redis: run under scripts/with-services.sh")
    return url


@pytest.fixture(params=BACKENDS)
def kind(request: Any) -> str:
    return str(request.param)


@pytest.fixture
def make(kind: str, table: leaselock.LeaseTable) -> Callable[..., LeaderElector]:
    """Electors on one backend, sharing a key prefix unique to the test."""
    prefix = f"t-{uuid.uuid4().hex[:8]}/"
    backend: Any = table
    if kind == "redis":
        backend = leaselock.RedisElection(
            redis_url(), lease_ms=LEASE_MS, renew_ms=RENEW_MS, clock_skew_ms=SKEW_MS, key_prefix="py-election:"
        )
        # A prefix's first use, like a Redis that lost its state, holds claims off for one
        # lease + skew: wait it out once before the test's own claims.
        opener = LeaderElector(backend, "opener", key_prefix=prefix, wait_ms=LEASE_MS + SKEW_MS + 5_000, retry_ms=100)
        assert asyncio.run(opener.run_if_leader("open", lambda term: asyncio.sleep(0))).led

    def make(candidate_id: str, **kw: Any) -> LeaderElector:
        return LeaderElector(backend, candidate_id, key_prefix=prefix, **kw)

    return make


def take_away(kind: str, table_name: str, dynamodb: Any, term: Term) -> None:
    """Rewrites the held lease behind its holder's back (another owner, far expiry)."""
    if kind == "dynamodb":
        steal(dynamodb, table_name, term.key)
    else:
        key = "py-election:" + term.key
        out = subprocess.run(
            ["redis-cli", "-u", redis_url(), "SET", key, "thief|999999", "PX", "600000"],
            check=True,
            capture_output=True,
            text=True,
        )
        assert out.stdout.strip() == "OK"


def test_one_leader_at_a_time_with_increasing_fences(make: Callable[..., LeaderElector]) -> None:
    """Contenders as asyncio tasks and in a second thread's loop: never two leaders at once,
    and the fences of successive terms strictly increase."""
    lock = threading.Lock()
    state: Dict[str, Any] = {"active": 0, "max": 0, "fences": []}
    terms_wanted = 8

    async def action(term: Term) -> int:
        with lock:
            state["active"] += 1
            state["max"] = max(state["max"], state["active"])
            state["fences"].append(term.fence)
        await asyncio.sleep(0.15)
        with lock:
            state["active"] -= 1
        return term.fence

    async def contender(elector: LeaderElector) -> List[int]:
        led = []
        while len(state["fences"]) < terms_wanted:
            outcome = await elector.run_if_leader("singleton", action)
            if outcome.led:
                assert outcome.end == "finished" and outcome.value == outcome.fence
                led.append(outcome.fence)
            else:
                assert outcome.holder is not None
        return led

    async def here() -> List[List[int]]:
        electors = [make(f"task-{i}", wait_ms=3_000, retry_ms=100) for i in range(3)]
        return list(await asyncio.gather(*(contender(e) for e in electors)))

    threaded: List[List[int]] = []
    thread = threading.Thread(
        target=lambda: threaded.append(asyncio.run(contender(make("thread-0", wait_ms=3_000, retry_ms=100))))
    )
    thread.start()
    led = asyncio.run(here())
    thread.join(30)
    assert not thread.is_alive()
    assert state["max"] == 1
    fences = state["fences"]
    assert len(fences) >= terms_wanted
    assert all(a < b for a, b in zip(fences, fences[1:])), fences
    assert sorted(sum(led + threaded, [])) == fences


def test_a_skipped_contender_sees_the_holder(make: Callable[..., LeaderElector]) -> None:
    async def main() -> Tuple[Any, Any, Any]:
        a, b = make("holder-a"), make("other-b")
        entered, leave = asyncio.Event(), asyncio.Event()

        async def hold(term: Term) -> str:
            entered.set()
            await leave.wait()
            return "done"

        first = asyncio.ensure_future(a.run_if_leader("job", hold))
        await asyncio.wait_for(entered.wait(), 10)
        skipped = await b.run_if_leader("job", hold)
        leave.set()
        led = await first
        # Released at the end: the other one is elected at once.
        after = await b.run_if_leader("job", lambda term: asyncio.sleep(0, term.fence))
        return skipped, led, after

    skipped, led, after = asyncio.run(main())
    assert skipped.skipped and not skipped.led and skipped.holder == "holder-a"
    assert led.led and led.value == "done" and led.end == "finished"
    assert after.led and after.value > led.fence


def test_a_terms_deadline_is_the_monotonic_instant_lease_less_skew_after_the_claim(
    make: Callable[..., LeaderElector],
) -> None:
    """As a lease's (test_lease.py): ``term.deadline`` is the ``time.monotonic()`` reading at which
    the term ends, lease - skew after its claim was sent, and ``time_left()`` the seconds until then."""
    seen: Dict[str, float] = {}

    async def action(term: Term) -> None:
        t0 = time.monotonic()
        seen["left"] = term.time_left()
        seen.update(t0=t0, t1=time.monotonic(), deadline=term.deadline)

    before = time.monotonic()
    outcome = asyncio.run(make("timed").run_if_leader("timed", action))
    assert outcome.led, outcome
    window = (LEASE_MS - SKEW_MS) / 1000
    assert before + window - 0.002 <= seen["deadline"] <= seen["t0"] + window, (seen["deadline"] - before, window)
    assert seen["deadline"] - seen["t1"] - 0.001 <= seen["left"] <= seen["deadline"] - seen["t0"] + 0.001, seen


def test_the_action_is_cancelled_when_the_lease_is_taken_away(
    kind: str, make: Callable[..., LeaderElector], table_name: str, dynamodb: Any
) -> None:
    seen: Dict[str, Any] = {}

    async def action(term: Term) -> str:
        seen["term"] = term
        await asyncio.get_running_loop().run_in_executor(None, take_away, kind, table_name, dynamodb, term)
        seen["stolen_at"] = time.monotonic()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen["cancelled_at"] = time.monotonic()
            raise
        return "never"

    outcome = asyncio.run(make("victim").run_if_leader("taken", action))
    assert outcome.led and outcome.end == "lost" and outcome.value is None
    # Cancelled by the first failed renewal, well within a lease.
    assert seen["cancelled_at"] - seen["stolen_at"] < LEASE_MS / 1000
    assert seen["term"].cancelled


def test_an_exception_of_the_action_is_raised_after_the_release(make: Callable[..., LeaderElector]) -> None:
    async def fails(term: Term) -> None:
        raise ValueError("boom")

    async def main() -> Any:
        with pytest.raises(ValueError, match="boom"):
            await make("a").run_if_leader("failing", fails)
        return await make("b").run_if_leader("failing", lambda term: asyncio.sleep(0, "ran"))

    assert asyncio.run(main()).value == "ran"


def test_the_decorator_form(make: Callable[..., LeaderElector]) -> None:
    a, b = make("deco-a"), make("deco-b")

    async def main() -> Tuple[Any, Any]:
        entered, leave = asyncio.Event(), asyncio.Event()

        @a.leader("report")
        async def report(term: Term, day: str) -> Tuple[int, str]:
            entered.set()
            await leave.wait()
            return term.fence, day

        @b.leader("report")
        async def other(term: Term, day: str) -> str:
            return "should not run"

        first = asyncio.ensure_future(report("monday"))
        await asyncio.wait_for(entered.wait(), 10)
        second = await other("monday")
        leave.set()
        return await first, second

    first, second = asyncio.run(main())
    assert first.led and first.value == (first.fence, "monday")
    assert second.skipped and second.holder == "deco-a"
    assert report_name_kept()


def report_name_kept() -> bool:
    """functools.wraps keeps the decorated function's name."""
    e = LeaderElector(leaselock.LeaseTable("unused"), "x")

    @e.leader("n")
    async def nightly(term: Term) -> None: ...

    return nightly.__name__ == "nightly"


def test_async_with(kind: str, make: Callable[..., LeaderElector], table_name: str, dynamodb: Any) -> None:
    a, b = make("with-a"), make("with-b")

    async def main() -> Dict[str, Any]:
        got: Dict[str, Any] = {}
        async with a.lead("ctx") as term:
            assert term is not None
            got["fence"] = term.fence
            lead = b.lead("ctx")
            async with lead as none:
                got["other"] = none
            got["holder"] = lead.outcome.holder if lead.outcome else None
        # Released on leaving: b is elected at once, with a higher fence.
        async with b.lead("ctx") as term2:
            got["fence2"] = term2.fence if term2 else None
        # The block is cancelled when the term ends early, and the async with says so.
        with pytest.raises(leaselock.LeaseLost):
            async with a.lead("ctx") as term3:
                assert term3 is not None
                await asyncio.get_running_loop().run_in_executor(None, take_away, kind, table_name, dynamodb, term3)
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    got["cancelled"] = True
                    raise
        got["after"] = "still running"
        return got

    got = asyncio.run(main())
    assert got["other"] is None and got["holder"] == "with-a"
    assert got["fence2"] is not None and got["fence2"] > got["fence"]
    assert got["cancelled"] and got["after"] == "still running"


def test_slots_admit_that_many(make: Callable[..., LeaderElector]) -> None:
    async def main() -> List[Any]:
        entered = [asyncio.Event() for _ in range(2)]
        leave = asyncio.Event()

        async def hold(term: Term) -> Any:
            entered[len([e for e in entered if e.is_set()])].set()
            await leave.wait()
            return term.slot

        a = asyncio.ensure_future(make("s-a").run_if_slot("pool", 2, hold))
        b = asyncio.ensure_future(make("s-b").run_if_slot("pool", 2, hold))
        for e in entered:
            await asyncio.wait_for(e.wait(), 10)
        third = await make("s-c").run_if_slot("pool", 2, hold)
        leave.set()
        return [await a, await b, third]

    a, b, third = asyncio.run(main())
    assert a.led and b.led and {a.value, b.value} == {0, 1}
    assert third.skipped and third.holder in ("s-a", "s-b")


def test_strategic_election_picks_the_highest_score(make: Callable[..., LeaderElector]) -> None:
    async def main() -> Tuple[Any, Any]:
        entered, leave = asyncio.Event(), asyncio.Event()

        async def hold(term: Term) -> int:
            entered.set()
            await leave.wait()
            return term.fence

        high = asyncio.ensure_future(
            make("high").run_if_elected("primary", hold, candidate=leaselock.Candidate(10.0))
        )
        await asyncio.wait_for(entered.wait(), 10)
        low = await make("low", wait_ms=500).run_if_elected("primary", hold, candidate=leaselock.Candidate(1.0))
        leave.set()
        return await high, low

    high, low = asyncio.run(main())
    assert high.led and high.value == high.fence
    assert low.skipped and low.holder == "high"


def test_bad_settings_raise_invalid_input(table: leaselock.LeaseTable) -> None:
    # The retry delay is refused under the name it was given as.
    with pytest.raises(leaselock.InvalidInput) as e:
        LeaderElector(table, "x", retry_delay_ms=0)
    assert e.value.field == "retry_delay_ms"
    with pytest.raises(leaselock.InvalidInput) as e:
        LeaderElector(table, "x", retry_ms=0)
    assert e.value.field == "retry_ms"
    with pytest.raises(leaselock.InvalidInput) as e:
        LeaderElector(table, "x", retry_delay_ms=100, retry_ms=100)
    assert e.value.field == "retry_ms" and "retry_delay_ms" in str(e.value)
    with pytest.raises(leaselock.InvalidInput) as e:
        LeaderElector(table, "")
    assert e.value.field == "candidate_id"
    with pytest.raises(leaselock.InvalidInput) as e:
        LeaderElector(object(), "x")  # type: ignore[arg-type]
    assert e.value.field == "backend"
    elector = LeaderElector(table, "x")
    with pytest.raises(leaselock.InvalidInput) as e:
        asyncio.run(elector.run_if_elected("n", lambda t: asyncio.sleep(0), strategy="fastest"))
    assert e.value.field == "strategy"


def test_redis_settings_are_checked() -> None:
    with pytest.raises(leaselock.InvalidInput) as e:
        leaselock.RedisElection(redis_url(), lease_ms=1_000, clock_skew_ms=1_000)
    assert e.value.field == "lease_ms"
    with pytest.raises(leaselock.Unreachable):
        leaselock.RedisElection("redis://127.0.0.1:1")


def test_a_leader_steps_down_for_the_preferred_candidate(make: Callable[..., LeaderElector]) -> None:
    strategy = ("preferred", "pref-low")

    async def main() -> Tuple[Any, Any]:
        entered = asyncio.Event()

        async def hold(term: Term) -> str:
            entered.set()
            await asyncio.sleep(30)
            return "never"

        async def lead(term: Term) -> int:
            return term.fence

        high = asyncio.ensure_future(
            make("pref-high", term_ms=1_000).run_if_elected(
                "primary", hold, candidate=leaselock.Candidate(10.0), strategy=strategy
            )
        )
        await asyncio.wait_for(entered.wait(), 10)
        low = await make("pref-low", wait_ms=8_000, retry_ms=100).run_if_elected(
            "primary", lead, candidate=leaselock.Candidate(1.0, load=0.5), strategy=strategy
        )
        return await high, low

    high, low = asyncio.run(main())
    # Alone, the highest score leads; once the preferred candidate registers, the leader is
    # cancelled at its next term boundary and the preferred one is elected with a higher fence.
    assert high.led and high.end == "stepped_down" and high.value is None
    assert low.led and low.value == low.fence and low.fence > high.fence


def test_the_elector_takes_the_options_of_rust_and_node_in_their_order() -> None:
    """Rust's ElectionOptions fields, Node's LeaderElector options and Python's keyword
    arguments are one list in one order (Python's and Node's with their `_ms` / `Ms` unit)."""
    import inspect
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    options = (root / "core" / "src" / "election" / "options.rs").read_text()
    body = options.split("pub struct ElectionOptions {", 1)[1].split("\n}", 1)[0]
    rust = re.findall(r"^\s*pub (\w+):", body, flags=re.M)
    node_src = (root / "bindings" / "wasm" / "src" / "election.rs").read_text()
    node = re.findall(r'"(\w+)"', node_src.split("const OPTIONS: &[&str] = &[", 1)[1].split("];", 1)[0])
    params = inspect.signature(LeaderElector.__init__).parameters.values()
    python = [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name != "retry_ms"]

    def ms(name: str) -> str:
        return name if name == "key_prefix" else f"{name}_ms"

    def camel(name: str) -> str:
        head, *rest = name.split("_")
        return head + "".join(w.title() for w in rest)

    assert rust == ["wait", "min_lease", "key_prefix", "retry_delay", "term", "candidate_ttl"], rust
    assert python == [ms(n) for n in rust]
    assert node == ["owner", *[camel(ms(n)) for n in rust]]
