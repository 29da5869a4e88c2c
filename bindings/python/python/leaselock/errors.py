"""The exception tree: every error leaselock raises is a :class:`LeaseLockError`.

- :class:`LeaseHeld` (``.owner``, ``.expires_at_ms``): someone else holds an unexpired lease.
- :class:`LeaseLost`: the lease is no longer ours (taken over, released, past the deadline).
- :class:`LeaseNotFound`, :class:`LeaseStopped`: no item; the work is STOPPED.
- :class:`SeqNotIncreasing` (``.last_seq``, ``.seq``): a checkpoint must move forward.
- :class:`Throttled`: the store kept throttling until the retry budget ran out.
- :class:`InvalidInput` (``.field``): refused before anything was written.
- :class:`StoreError` and its kinds :class:`Timeout` (``.outcome_unknown``),
  :class:`Unreachable`, :class:`AccessDenied`, :class:`TableNotFound` (``.table``),
  :class:`NotConfigured` (no AWS credentials or no region: raised at the first request, at once).
- :class:`InternalError`: a bug in leaselock (a panic stopped at the binding's edge); no input
  should ever raise it.
"""

from ._native import (
    AccessDenied,
    InternalError,
    InvalidInput,
    LeaseHeld,
    LeaseLockError,
    LeaseLost,
    LeaseNotFound,
    LeaseStopped,
    NotConfigured,
    SeqNotIncreasing,
    StoreError,
    TableNotFound,
    Throttled,
    Timeout,
    Unreachable,
)

__all__ = [
    "AccessDenied",
    "InternalError",
    "InvalidInput",
    "LeaseHeld",
    "LeaseLockError",
    "LeaseLost",
    "LeaseNotFound",
    "LeaseStopped",
    "NotConfigured",
    "SeqNotIncreasing",
    "StoreError",
    "TableNotFound",
    "Throttled",
    "Timeout",
    "Unreachable",
]
