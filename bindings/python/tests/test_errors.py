"""The exception tree: one root, the store kinds under StoreError, public module path."""

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
