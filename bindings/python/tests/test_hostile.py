"""Hostile input at every public entry point: generated values (control and invisible format
characters, lone surrogates, huge strings, huge, negative and non-finite numbers, wrong types)
are each refused with ``InvalidInput`` naming the argument, in a one-line message under 1 KB
without a raw control character; nothing crashes and a full scan of the table is unchanged."""

from __future__ import annotations

import asyncio
import sys
import unicodedata
from typing import Any, Callable, Dict, List, Tuple

import boto3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import leaselock
from leaselock import InternalError, InvalidInput

from conftest import LEASE_MS, RENEW_MS, SKEW_MS, unique

# Core's refused characters (leaselock::config::is_refused_char): every control character and
# the invisible format characters of REFUSED_FORMAT_CHARS; and lone surrogates, which are not
# valid Unicode at all.
CONTROL = [chr(c) for c in [*range(0, 32), *range(0x7F, 0xA0)]]
FORMAT = ["\u00ad", "\u061c", "\u180e", "\u200b", "\u200f", "\u2028", "\u202e", "\u2066", "\u206f", "\ufeff", "\ufffa", "\U000e0041"]
SURROGATES = ["\ud800", "\udbff", "\udc00", "\udfff"]
REFUSED = set(CONTROL + FORMAT)

printable = st.text(alphabet=st.characters(exclude_categories=("Cs", "Cc", "Cf", "Zl", "Zp")), max_size=24)


@st.composite
def with_bad_char(draw: Any) -> str:
    s = draw(printable)
    at = draw(st.integers(0, len(s)))
    return s[:at] + draw(st.sampled_from(CONTROL + FORMAT + SURROGATES)) + s[at:]


# Longer than any id (1,024 bytes), key prefix, url or name allows.
huge_text = st.one_of(
    st.integers(4097, 300_000).map(lambda n: "x" * n),
    st.integers(1366, 20_000).map(lambda n: "\u65e5" * n),
    st.integers(4097, 50_000).map(lambda n: "\x1b[2J" * (n // 4)),
)
wrong_type = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.binary(max_size=8),
    st.lists(st.text(max_size=3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
    st.just(object()),
)
hostile_text = st.one_of(with_bad_char(), huge_text, wrong_type)
hostile_id = st.one_of(hostile_text, st.just(""))

THIRTY_DAYS_MS = 30 * 24 * 3600 * 1000
not_an_int = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=6),
    st.lists(st.integers(), max_size=2),
    st.just(None),
)
hostile_ms = st.one_of(st.integers(max_value=-1), st.integers(THIRTY_DAYS_MS + 1, 2**200), not_an_int)


def hostile_count(limit: int) -> Any:
    return st.one_of(st.integers(max_value=-1), st.integers(limit + 1, 2**200), not_an_int)


hostile_number = st.one_of(
    st.sampled_from([float("nan"), float("inf"), float("-inf")]),
    st.booleans(),
    st.text(max_size=4),
    st.lists(st.integers(), max_size=2),
    st.just(10**400),
)

# How many hostile calls were made (reported by the last test).
CASES: List[int] = [0]


def refused_as(field: Any, call: Callable[[], Any]) -> None:
    """`call` raises InvalidInput naming `field` (or one of them), with a clean, bounded,
    one-line message."""
    fields = (field,) if isinstance(field, str) else field
    CASES[0] += 1
    try:
        result = call()
        if asyncio.iscoroutine(result):
            asyncio.run(result)
    except InternalError as e:  # the last-resort guard must never be reached
        pytest.fail(f"{field}: the panic guard was reached: {e}")
    except InvalidInput as e:
        message = str(e)
        assert e.field in fields, (field, e.field, message[:300])
        assert len(message.encode()) < 1024, (field, len(message))
        assert not any(c in REFUSED or unicodedata.category(c) == "Cs" for c in message), (field, message[:300])
        assert "\n" not in message and "\r" not in message
        assert not any(c in REFUSED for c in str(e.field)), e.field
        return
    except Exception as e:  # noqa: BLE001 (any other type is the failure being tested)
        pytest.fail(f"{field}: {type(e).__name__} instead of InvalidInput: {str(e)[:300]}")
    pytest.fail(f"{field}: accepted")


async def noop(term: Any) -> None:
    return None


@pytest.fixture(scope="module")
def world() -> Dict[str, Any]:
    """A table of its own with one item, one held lease and a few objects to call."""
    name = unique("py-hostile")
    leaselock.LeaseTable(name).create_table()
    table = leaselock.LeaseTable(name, lease_ms=LEASE_MS, renew_ms=RENEW_MS, clock_skew_ms=SKEW_MS)
    table.start("stream-1", "wss://feed.example/1")
    lease = table.acquire("stream-1", "owner-1")
    session_table = leaselock.LeaseTable(name, lease_ms=LEASE_MS, renew_ms=RENEW_MS, clock_skew_ms=SKEW_MS, mode="session")
    elector = leaselock.LeaderElector(table, "candidate-1")
    dynamodb = boto3.client("dynamodb")

    def scan() -> List[Any]:
        items = dynamodb.scan(TableName=name, ConsistentRead=True)["Items"]
        return sorted(items, key=lambda i: i["connection_id"]["S"])

    world = {"name": name, "table": table, "lease": lease, "session_table": session_table, "elector": elector, "scan": scan}
    before = scan()
    yield world
    assert scan() == before, "a hostile call changed the table"
    print(f"\nhostile calls refused: {CASES[0]}", file=sys.stderr)


def entry_points(w: Dict[str, Any]) -> List[Tuple[str, Any, Any, Callable[[Any], Any]]]:
    """(label, expected field, strategy, call with the hostile value)."""
    name, t, lease, e = w["name"], w["table"], w["lease"], w["elector"]
    table = lambda **kw: lambda: leaselock.LeaseTable(name, **kw)  # noqa: E731
    worker = lambda **kw: lambda: leaselock.Worker(t, **kw)  # noqa: E731
    elector = lambda **kw: lambda: leaselock.LeaderElector(t, "c", **kw)  # noqa: E731
    points: List[Tuple[str, Any, Any, Callable[[Any], Any]]] = [
        ("LeaseTable(table_name)", "table_name", hostile_id, lambda v: lambda: leaselock.LeaseTable(v)),
        ("LeaseTable(key_prefix)", "key_prefix", hostile_text, lambda v: table(key_prefix=v)),
        ("LeaseTable(index_name)", "index_name", hostile_id, lambda v: table(index_name=v)),
        ("LeaseTable(owner_index_name)", "owner_index_name", hostile_id, lambda v: table(owner_index_name=v)),
        ("LeaseTable(mode)", "mode", hostile_id, lambda v: table(mode=v)),
        ("LeaseTable(attributes)", ("attributes", "attributes.owner"), st.one_of(wrong_type.filter(lambda v: not isinstance(v, dict)), st.dictionaries(hostile_text.filter(lambda k: isinstance(k, str)), st.just("owner_x"), min_size=1, max_size=1), st.dictionaries(st.just("owner"), hostile_text, min_size=1, max_size=1)), lambda v: table(attributes=v)),
        ("start(id)", "id", hostile_id, lambda v: lambda: t.start(v, "wss://feed.example/x")),
        ("start(url)", "url", hostile_id, lambda v: lambda: t.start("stream-2", v)),
        ("stop(id)", "id", hostile_id, lambda v: lambda: t.stop(v)),
        ("acquire(id)", "id", hostile_id, lambda v: lambda: t.acquire(v, "owner-2")),
        ("acquire(owner)", "owner", hostile_id, lambda v: lambda: t.acquire("stream-1", v)),
        ("hold(owner)", "owner", hostile_id, lambda v: lambda: t.hold("stream-1", v).__enter__()),
        ("get(id)", "id", hostile_id, lambda v: lambda: t.get(v)),
        ("owned_by(owner)", "owner", hostile_id, lambda v: lambda: t.owned_by(v)),
        ("create_session(owner)", "owner", hostile_id, lambda v: lambda: w["session_table"].create_session(v)),
        ("checkpoint(seq)", "seq", st.one_of(st.integers(max_value=-1), st.integers(2**64, 2**200), not_an_int), lambda v: lambda: lease.checkpoint(v)),
        ("Worker(queue_url)", "queue_url", hostile_text, lambda v: worker(queue_url=v)),
        ("Worker(worker_id)", "worker_id", hostile_id, lambda v: worker(worker_id=v)),
        ("Worker(metrics_namespace)", "metrics_namespace", hostile_id, lambda v: worker(metrics_namespace=v)),
        ("Worker(max_connections)", "max_connections", hostile_count(100_000), lambda v: worker(max_connections=v)),
        ("Worker(hint_wait_ms)", "hint_wait_ms", hostile_ms, lambda v: worker(hint_wait_ms=v)),
        ("Worker(orphan_interval_ms)", "orphan_interval_ms", hostile_ms, lambda v: worker(orphan_interval_ms=v)),
        ("Worker(desired_state_interval_ms)", "desired_state_interval_ms", hostile_ms, lambda v: worker(desired_state_interval_ms=v)),
        ("Worker(metrics_interval_ms)", "metrics_interval_ms", hostile_ms, lambda v: worker(metrics_interval_ms=v)),
        ("Worker(handler_grace_ms)", "handler_grace_ms", hostile_ms, lambda v: worker(handler_grace_ms=v)),
        ("Worker(index_lag_ms)", "index_lag_ms", hostile_ms, lambda v: worker(index_lag_ms=v)),
        ("Worker(balance)", "balance", st.one_of(st.integers(), st.text(max_size=4), st.just(None)), lambda v: worker(balance=v)),
        ("RedisElection(url)", "url", hostile_id, lambda v: lambda: leaselock.RedisElection(v)),
        ("RedisElection(key_prefix)", "key_prefix", hostile_text, lambda v: lambda: leaselock.RedisElection("redis://127.0.0.1:1", key_prefix=v)),
        ("RedisElection(lease_ms)", "lease_ms", hostile_ms, lambda v: lambda: leaselock.RedisElection("redis://127.0.0.1:1", lease_ms=v)),
        ("LeaderElector(candidate_id)", "candidate_id", hostile_id, lambda v: lambda: leaselock.LeaderElector(t, v)),
        ("LeaderElector(key_prefix)", "key_prefix", hostile_text, lambda v: elector(key_prefix=v)),
        ("LeaderElector(wait_ms)", "wait_ms", hostile_ms, lambda v: elector(wait_ms=v)),
        ("LeaderElector(min_lease_ms)", "min_lease_ms", hostile_ms, lambda v: elector(min_lease_ms=v)),
        # None leaves the retry delay at its default, under either name.
        ("LeaderElector(retry_delay_ms)", "retry_delay_ms", hostile_ms.filter(lambda v: v is not None), lambda v: elector(retry_delay_ms=v)),
        ("LeaderElector(retry_ms)", "retry_ms", hostile_ms.filter(lambda v: v is not None), lambda v: elector(retry_ms=v)),
        ("LeaderElector(term_ms)", "term_ms", st.one_of(st.integers(max_value=-1), st.integers(THIRTY_DAYS_MS + 1, 2**200)), lambda v: elector(term_ms=v)),
        ("LeaderElector(candidate_ttl_ms)", "candidate_ttl_ms", st.one_of(st.integers(max_value=0), st.integers(THIRTY_DAYS_MS + 1, 2**200)), lambda v: elector(candidate_ttl_ms=v)),
        ("run_if_leader(name)", "name", hostile_id, lambda v: lambda: e.run_if_leader(v, noop)),
        ("run_if_slot(name)", "name", hostile_id, lambda v: lambda: e.run_if_slot(v, 2, noop)),
        ("run_if_slot(slots)", "slots", st.one_of(st.just(0), hostile_count(1_000)), lambda v: lambda: e.run_if_slot("jobs", v, noop)),
        ("run_if_elected(name)", "name", hostile_id, lambda v: lambda: e.run_if_elected(v, noop)),
        ("run_if_elected(strategy)", "strategy", hostile_id, lambda v: lambda: e.run_if_elected("jobs", noop, strategy=v)),
        ("run_if_elected(preferred)", "strategy", hostile_id, lambda v: lambda: e.run_if_elected("jobs", noop, strategy=("preferred", v))),
        ("Candidate(score)", "score", hostile_number, lambda v: lambda: e.run_if_elected("jobs", noop, candidate=leaselock.Candidate(v))),
        ("Candidate(load)", "load", hostile_number, lambda v: lambda: e.run_if_elected("jobs", noop, candidate=leaselock.Candidate(load=v))),
        ("Candidate(metadata)", "metadata", st.one_of(wrong_type.filter(lambda v: not isinstance(v, dict) and v is not None), st.dictionaries(hostile_text.filter(lambda k: isinstance(k, str)), st.just("v"), min_size=1, max_size=1)), lambda v: lambda: e.run_if_elected("jobs", noop, candidate=leaselock.Candidate(metadata=v))),
    ]
    return points


LABELS = [p[0] for p in entry_points({"name": "n", "table": None, "lease": None, "session_table": None, "elector": None})]


@pytest.mark.parametrize("label", LABELS)
def test_hostile_values_are_refused_naming_the_argument(world: Dict[str, Any], label: str) -> None:
    (_, field, values, make) = next(p for p in entry_points(world) if p[0] == label)

    @settings(max_examples=50, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(values)
    def check(value: Any) -> None:
        refused_as(field, make(value))

    check()


def test_a_huge_value_is_refused_quickly_and_briefly(world: Dict[str, Any]) -> None:
    """5 MB values (each entry point's worst case in the reports) are quoted bounded."""
    big = "\x1b" * 5_000_000
    refused_as("id", lambda: world["table"].get(big))
    refused_as("mode", lambda: leaselock.LeaseTable(world["name"], mode=big))
    refused_as("strategy", lambda: world["elector"].run_if_elected("jobs", noop, strategy=big))
    refused_as("strategy", lambda: world["elector"].run_if_elected("jobs", noop, strategy=("preferred", big)))
    refused_as("queue_url", lambda: leaselock.Worker(world["table"], queue_url=big))
    # A candidate's fields, as Node's runIfElected is tried with a 5 MB score: named, not echoed.
    plain = "x" * 5_000_000
    elect = world["elector"].run_if_elected
    refused_as("score", lambda: elect("jobs", noop, candidate=leaselock.Candidate(plain)))  # type: ignore[arg-type]
    refused_as("load", lambda: elect("jobs", noop, candidate=leaselock.Candidate(load=plain)))  # type: ignore[arg-type]
    refused_as("metadata", lambda: elect("jobs", noop, candidate=leaselock.Candidate(metadata={"k": plain})))
    refused_as("metadata", lambda: elect("jobs", noop, candidate=leaselock.Candidate(metadata={plain: "v"})))


def test_the_manual_shows_the_python_error_for_a_hostile_id(world: Dict[str, Any]) -> None:
    """The API page's sample under "What ids, urls and names may be" prints what it says it prints."""
    import contextlib
    import io
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[3] / "docs" / "src" / "api-reference.md"
    section = page.read_text().split("## What ids, urls and names may be\n", 1)[1].split("\n## ", 1)[0]
    code = re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]
    expected = re.findall(r"```text\n(.*?)```", section, flags=re.S)[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.replace('"leases"', repr(world["name"])), "api-reference.md (ids)", "exec"), {})
    assert out.getvalue() == expected
