"""leaselock: exactly-one ownership of long-lived work through time-bounded DynamoDB leases.

The lease operations, the background renewal and the worker runtime are the Rust crate's own,
called through a native module; this package is the Python face of them.

>>> import leaselock
>>> issubclass(leaselock.LeaseLost, leaselock.LeaseLockError)
True
"""

from .errors import (
    AccessDenied,
    InvalidInput,
    LeaseHeld,
    LeaseLockError,
    LeaseLost,
    LeaseNotFound,
    LeaseStopped,
    SeqNotIncreasing,
    StoreError,
    TableNotFound,
    Throttled,
    Timeout,
    Unreachable,
)
from .lease import AsyncLease, Lease, LeaseItem
from .table import AsyncHold, AsyncLeaseTable, Hold, LeaseTable
from .worker import Connection, Worker, WorkerSnapshot

__all__ = [
    "AccessDenied",
    "AsyncHold",
    "AsyncLease",
    "AsyncLeaseTable",
    "Connection",
    "Hold",
    "InvalidInput",
    "Lease",
    "LeaseHeld",
    "LeaseItem",
    "LeaseLockError",
    "LeaseLost",
    "LeaseNotFound",
    "LeaseStopped",
    "LeaseTable",
    "SeqNotIncreasing",
    "StoreError",
    "TableNotFound",
    "Throttled",
    "Timeout",
    "Unreachable",
    "Worker",
    "WorkerSnapshot",
]
