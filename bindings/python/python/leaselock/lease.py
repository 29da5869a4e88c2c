"""Held leases and stored items.

A :class:`Lease` (blocking) or :class:`AsyncLease` (coroutines) is what a claim returns. Its
``deadline`` is when the owner must stop acting for the work, as a :func:`time.monotonic`
reading (seconds; the instant Rust's ``Lease::deadline()`` and Node's ``lease.deadline`` name on
their own monotonic clocks), and ``time_left()`` the seconds from now until then (0.0 once
past): the lease is measured from when the last successful write was *sent*, less the clock
skew, so the owner stops before any other worker may claim. ``asyncio.timeout_at(lease.deadline)``
bounds a block by it.
"""

from __future__ import annotations

from types import TracebackType
from typing import Optional, Type

from . import _native

LeaseItem = _native.LeaseItem
"""One stored lease item, as read: ``id, desired_state, url, owner, expires_at_ms, last_seq,
fence, ttl``."""

__all__ = ["AsyncLease", "Lease", "LeaseItem"]


class _LeaseView:
    """The lease's fields, shared by the blocking and the async handle."""

    __slots__ = ("_native",)

    def __init__(self, native: _native.Lease) -> None:
        self._native = native

    @property
    def id(self) -> str:
        """The work's id."""
        return self._native.id

    @property
    def owner(self) -> str:
        """The owner name written into the lease."""
        return self._native.owner

    @property
    def fence(self) -> int:
        """This claim's fencing token: every claim of the id increments it."""
        return self._native.fence

    @property
    def expires_at_ms(self) -> int:
        """The stored expiry, epoch ms (the writer's wall clock)."""
        return self._native.expires_at_ms

    @property
    def last_seq(self) -> Optional[int]:
        """The last checkpointed sequence number: resume after it."""
        return self._native.last_seq

    @property
    def url(self) -> Optional[str]:
        """Where the work lives (``ws_url``)."""
        return self._native.url

    @property
    def desired_state(self) -> Optional[str]:
        """``"STARTED"``, ``"STOPPED"`` or ``None``, as of the last write."""
        return self._native.desired_state

    @property
    def deadline(self) -> float:
        """The local deadline: the :func:`time.monotonic` reading at which the owner must stop
        acting (every renewal moves it later)."""
        return self._native.deadline

    def time_left(self) -> float:
        """Seconds left before :attr:`deadline` (``deadline - time.monotonic()``), 0.0 once past."""
        return self._native.time_left()

    @property
    def cancelled(self) -> bool:
        """True once a held scope's lease ended: deadline, lost, STOPPED or released."""
        return self._native.cancelled

    @property
    def cancel_reason(self) -> Optional[str]:
        """``"Deadline"``, ``"Lost"``, ``"Stopped"`` or ``"Released"`` once cancelled."""
        return self._native.cancel_reason

    @property
    def in_session(self) -> bool:
        """True for a lease claimed under a session: its deadline is the session's, and
        ``renew`` renews the session."""
        return self._native.in_session

    def __repr__(self) -> str:
        return repr(self._native)


class Lease(_LeaseView):
    """A held lease with blocking methods; ``with lease:`` releases it on exit.

    Leaving the scope (here, in :meth:`LeaseTable.hold` and in Node's ``using()`` and ``await
    using`` alike) releases the lease unless it was lost (someone else's now) or released in the
    block already; after the deadline, on STOP or when the block raised it is released too (the
    write is conditional on owner and fence), so the next owner need not wait for the expiry.

    Every method releases the GIL while it waits for DynamoDB.
    """

    __slots__ = ()

    def renew(self) -> None:
        """Extends the lease; raises :class:`LeaseLost` if it is no longer ours or past its deadline."""
        self._native.renew()

    def checkpoint(self, seq: int) -> None:
        """Records ``seq`` as processed, under the lease and only forward (:class:`SeqNotIncreasing`)."""
        self._native.checkpoint(seq)

    def release(self) -> None:
        """Gives the lease up at once; :class:`LeaseLost` if it was no longer ours (nothing changes then)."""
        self._native.release()

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self._native.release_on_exit()


class AsyncLease(_LeaseView):
    """A held lease whose methods are coroutines; ``async with lease:`` releases it on exit, as
    :class:`Lease` does."""

    __slots__ = ()

    async def renew(self) -> None:
        """Extends the lease; raises :class:`LeaseLost` if it is no longer ours or past its deadline."""
        await self._native.renew_async()

    async def checkpoint(self, seq: int) -> None:
        """Records ``seq`` as processed, under the lease and only forward (:class:`SeqNotIncreasing`)."""
        await self._native.checkpoint_async(seq)

    async def release(self) -> None:
        """Gives the lease up at once; :class:`LeaseLost` if it was no longer ours (nothing changes then)."""
        await self._native.release_async()

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self._native.release_on_exit_async()
