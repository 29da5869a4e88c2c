"""leaselock: exactly-one ownership of long-lived work through time-bounded DynamoDB leases.

The lease operations, the background renewal and the worker runtime are the Rust crate's own,
called through a native module; this package is the Python face of them.

>>> import leaselock
>>> issubclass(leaselock.LeaseLost, leaselock.LeaseLockError)
True
"""

from ._native import __version__
from .errors import *  # noqa: F403  (the exception tree, listed in errors.__all__)
from .election import Candidate, Lead, LeaderElector, Outcome, RedisElection, Term
from .lease import AsyncLease, Lease, LeaseItem
from .session import AsyncSession, Session, SessionItem
from .table import AsyncHold, AsyncLeaseTable, Hold, LeaseTable
from .worker import Connection, Worker, WorkerSnapshot

__all__ = [
    "AccessDenied",
    "AsyncHold",
    "AsyncLease",
    "AsyncLeaseTable",
    "AsyncSession",
    "Candidate",
    "Connection",
    "Hold",
    "InternalError",
    "InvalidInput",
    "Lead",
    "LeaderElector",
    "Lease",
    "LeaseHeld",
    "LeaseItem",
    "LeaseLockError",
    "LeaseLost",
    "LeaseNotFound",
    "LeaseStopped",
    "LeaseTable",
    "NotConfigured",
    "Outcome",
    "RedisElection",
    "SeqNotIncreasing",
    "Session",
    "SessionItem",
    "StoreError",
    "TableNotFound",
    "Term",
    "Throttled",
    "Timeout",
    "Unreachable",
    "Worker",
    "WorkerSnapshot",
]
