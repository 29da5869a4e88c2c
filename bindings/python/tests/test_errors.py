"""The exception tree: one root, the store kinds under StoreError, public module path; bad
settings refused by name."""

import os
import re
import subprocess
import sys
from typing import Optional

import leaselock


def test_one_tree_under_lease_lock_error() -> None:
    for name in ["LeaseHeld", "LeaseLost", "LeaseNotFound", "LeaseStopped", "SeqNotIncreasing", "Throttled",
                 "InvalidInput", "StoreError"]:
        cls = getattr(leaselock, name)
        assert issubclass(cls, leaselock.LeaseLockError), name
        assert cls.__module__ == "leaselock", cls.__module__
    for name in ["Timeout", "Unreachable", "AccessDenied", "TableNotFound", "NotConfigured"]:
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


# A child without any AWS setting: no keys, no region, no profile files, no instance metadata.
_FIRST_REQUEST = """
import sys, time, leaselock
table = leaselock.LeaseTable("leases")
started = time.monotonic()
try:
    table.get("stream-1")
except leaselock.NotConfigured as e:
    print(f"{time.monotonic() - started:.3f} {e}")
else:
    sys.exit("no error")
"""


def _first_request_without(env: "dict[str, str]", tmp_path: "os.PathLike[str]") -> "tuple[float, str]":
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    clean.update(HOME=str(tmp_path), AWS_EC2_METADATA_DISABLED="true", **env)
    run = subprocess.run([sys.executable, "-c", _FIRST_REQUEST], env=clean, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    took, message = run.stdout.strip().split(" ", 1)
    return float(took), message


def test_missing_credentials_are_named_at_once(tmp_path: "os.PathLike[str]") -> None:
    took, message = _first_request_without({"AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}, tmp_path)
    assert message.startswith("AWS SDK not configured: no credentials (set AWS_ACCESS_KEY_ID"), message
    assert took < 3, took


def test_a_missing_region_is_named_at_once(tmp_path: "os.PathLike[str]") -> None:
    keys = {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x"}
    for endpoint in ({"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}, {}):
        took, message = _first_request_without({**keys, **endpoint}, tmp_path)
        assert message.startswith("AWS SDK not configured: no region (set AWS_REGION"), message
        assert took < 3, took


def test_version_is_the_crate_version() -> None:
    from importlib.metadata import version

    assert leaselock.__version__ == version("leaselock")
    assert leaselock.__version__.count(".") == 2


_LOGGED_CLAIM = """
import asyncio, sys, threading, leaselock
table = leaselock.LeaseTable(sys.argv[1])
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
worker.shutdown()
thread.join(20)
print("done")
"""


def _run_logged(log: Optional[str], table_name: str, id: str) -> "subprocess.CompletedProcess[str]":
    env = {k: v for k, v in os.environ.items() if k != "LEASELOCK_LOG"}
    if log is not None:
        env["LEASELOCK_LOG"] = log
    return subprocess.run(
        [sys.executable, "-c", _LOGGED_CLAIM, table_name, id], env=env, capture_output=True, text=True, timeout=60
    )


def test_leaselock_log_writes_the_librarys_logs_to_stderr_with_timestamps(table_name, ids) -> None:
    # stdout: the worker's metrics line (EMF) at shutdown, then the script's "done".
    run = _run_logged("leaselock=info", table_name, ids("logged"))
    assert run.returncode == 0 and run.stdout.splitlines()[-1] == "done", run.stderr
    claimed = [line for line in run.stderr.splitlines() if " claimed " in line and ids("logged") in line]
    assert len(claimed) == 1, run.stderr
    # As the CLI writes them: an RFC 3339 UTC timestamp, the level, the target (the engine's room
    # that decided it); no colours off a terminal.
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z +INFO leaselock::engine::claims: claimed ", claimed[0]), claimed[0]
    assert "\x1b[" not in run.stderr
    # Unset: nothing from the library.
    quiet = _run_logged(None, table_name, ids("quiet"))
    assert quiet.returncode == 0 and quiet.stdout.splitlines()[-1] == "done" and quiet.stderr == "", quiet.stderr
    # A filter that does not parse: said once, and the program runs on.
    bad = _run_logged("leaselock=loud", table_name, ids("bad"))
    assert bad.returncode == 0, bad.stderr
    assert bad.stderr.count("LEASELOCK_LOG=") == 1 and "ignored" in bad.stderr, bad.stderr
