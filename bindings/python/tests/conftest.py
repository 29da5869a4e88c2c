"""Shared fixtures: tables on the local engine (AWS_ENDPOINT_URL, set by scripts/with-services.sh)."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any, Callable, Iterator

import boto3
import pytest

import leaselock

# Short leases: the local engine does a few hundred operations a second.
LEASE_MS, RENEW_MS, SKEW_MS = 3_000, 1_000, 500


def pytest_configure(config: Any) -> None:
    if not os.environ.get("AWS_ENDPOINT_URL"):
        raise pytest.UsageError("run under scripts/with-services.sh: AWS_ENDPOINT_URL is not set")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def table_name() -> str:
    name = unique("py-leases")
    leaselock.LeaseTable(name).create_table()
    return name


@pytest.fixture
def table(table_name: str) -> leaselock.LeaseTable:
    return leaselock.LeaseTable(table_name, lease_ms=LEASE_MS, renew_ms=RENEW_MS, clock_skew_ms=SKEW_MS)


@pytest.fixture
def atable(table_name: str) -> leaselock.AsyncLeaseTable:
    return leaselock.AsyncLeaseTable(table_name, lease_ms=LEASE_MS, renew_ms=RENEW_MS, clock_skew_ms=SKEW_MS)


@pytest.fixture(scope="session")
def dynamodb() -> Any:
    return boto3.client("dynamodb")


@pytest.fixture
def ids() -> Iterator[Callable[[str], str]]:
    """Fresh ids, unique to the test."""
    run = uuid.uuid4().hex[:8]
    yield lambda name: f"{run}-{name}"


def raw_item(dynamodb: Any, table_name: str, id: str) -> dict:
    return dynamodb.get_item(TableName=table_name, Key={"connection_id": {"S": id}}, ConsistentRead=True).get("Item", {})


def steal(dynamodb: Any, table_name: str, id: str, owner: str = "thief") -> None:
    """Rewrites the lease item behind its holder's back: a new owner and fence, far expiry."""
    dynamodb.update_item(
        TableName=table_name,
        Key={"connection_id": {"S": id}},
        UpdateExpression="SET lease_owner = :o, lease_expires_at_ms = :e ADD fence :one",
        ExpressionAttributeValues={
            ":o": {"S": owner},
            ":e": {"N": str(int(time.time() * 1000) + 600_000)},
            ":one": {"N": "1"},
        },
    )


def wait_for(cond: Callable[[], Any], timeout: float, what: str, every: float = 0.05) -> Any:
    """Polls `cond` until it is truthy; fails after `timeout` seconds."""
    until = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > until:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)
