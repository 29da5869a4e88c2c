"""The exception tree: one root, the store kinds under StoreError, public module path; bad
settings refused by name."""

import os
import subprocess
import sys

import leaselock


def test_one_tree_under_lease_lock_error() -> None:
    for name in ["LeaseHeld", "LeaseLost", "LeaseNotFound", "LeaseStopped", "SeqNotIncreasing", "Throttled",
                 "InvalidInput", "StoreError"]:
        cls = getattr(leaselock, name)
        assert issubclass(cls, leaselock.LeaseLockError), name
        assert cls.__module__ == "leaselock", cls.__module__
    for name in ["Timeout", "Unreachable", "AccessDenied", "TableNotFound"]:
        assert issubclass(getattr(leaselock, name), leaselock.StoreError), name
    assert issubclass(leaselock.LeaseLockError, Exception)
    assert not issubclass(leaselock.LeaseLost, leaselock.StoreError)


def test_held_names_the_holder(table, ids) -> None:
    id = ids("held")
    lease = table.acquire(id, "a")
    try:
        table.acquire(id, "b")
    except leaselock.LeaseHeld as e:
        assert (e.owner, e.expires_at_ms) == ("a", lease.expires_at_ms)
    else:
        raise AssertionError("a second claim was granted")


def test_not_found_and_stopped(table, ids) -> None:
    id = ids("gone")
    try:
        table.stop(id)
    except leaselock.LeaseNotFound as e:
        assert e.id == id
    else:
        raise AssertionError("stop of a missing id succeeded")
    table.start(id, "wss://feed.example/x")
    table.stop(id)
    try:
        table.acquire(id, "a")
    except leaselock.LeaseStopped as e:
        assert e.id == id
    else:
        raise AssertionError("stopped work was claimed")


def _import_with_threads(value: str, code: str) -> "subprocess.CompletedProcess[str]":
    env = {**os.environ, "LEASELOCK_RUNTIME_THREADS": value}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_runtime_threads_outside_the_range_fail_the_import_naming_the_variable() -> None:
    for value in ["0", "-1", "many", "257"]:
        run = _import_with_threads(value, "import leaselock")
        assert run.returncode != 0, value
        assert "LEASELOCK_RUNTIME_THREADS must be a whole number from 1 to 256" in run.stderr, run.stderr
        assert repr(value) in run.stderr.replace('"', "'"), run.stderr


def test_more_runtime_threads_serve_blocking_and_asyncio_calls(table_name) -> None:
    code = (
        "import asyncio, leaselock\n"
        f"t = leaselock.LeaseTable({table_name!r})\n"
        "assert t.get('no-such-item') is None\n"
        f"a = leaselock.AsyncLeaseTable({table_name!r})\n"
        "assert asyncio.run(a.get('no-such-item')) is None\n"
        "print('served')\n"
    )
    run = _import_with_threads("3", code)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "served"
