"""Session mode: one heartbeat per worker.

On a table opened with ``mode="session"``, a worker holds one session item
(``session/{owner}``: an expiry and an epoch) and renews it for everything it holds; a claim made
under the session writes the connection once (owner, epoch, fence + 1) and is not written again
while the session lives. Renewing the session moves the deadline of every lease claimed under
it; once the session is lost or ended, those leases are refused locally (:class:`LeaseLost`).
When a session is dead (expired beyond the clock skew, ended, or of another epoch) another
session takes its work over with fence + 1.

>>> table = LeaseTable("leases", mode="session")  # doctest: +SKIP
>>> session = table.create_session("worker-a")  # doctest: +SKIP
>>> lease = session.claim("stream-1")  # doctest: +SKIP
>>> lease.checkpoint(7)  # doctest: +SKIP
>>> session.renew()  # one write for every lease held under it  # doctest: +SKIP
>>> session.end()  # one write frees everything  # doctest: +SKIP
"""

from __future__ import annotations

from . import _native
from .lease import AsyncLease, Lease

SessionItem = _native.SessionItem
"""One stored session, as listed: ``owner, epoch, expires_at_ms`` (0 once ended)."""

__all__ = ["AsyncSession", "Session", "SessionItem"]


class _SessionView:
    __slots__ = ("_native",)

    def __init__(self, native: _native.Session) -> None:
        self._native = native

    @property
    def owner(self) -> str:
        """The worker the session belongs to."""
        return self._native.owner

    @property
    def epoch(self) -> int:
        """This session's epoch: every new session of the owner gets a new one."""
        return self._native.epoch

    @property
    def expires_at_ms(self) -> int:
        """The stored expiry, epoch ms (the writer's wall clock)."""
        return self._native.expires_at_ms

    @property
    def deadline(self) -> float:
        """The session's local deadline, a :func:`time.monotonic` reading: every lease held
        under the session must stop acting by then."""
        return self._native.deadline

    def time_left(self) -> float:
        """Seconds left before :attr:`deadline`, 0.0 once past."""
        return self._native.time_left()

    def __repr__(self) -> str:
        return repr(self._native)


class Session(_SessionView):
    """A worker's session with blocking methods (the GIL is released while waiting)."""

    __slots__ = ()

    def renew(self) -> None:
        """Extends the session and with it every lease held under it; :class:`LeaseLost` once it
        was taken over, ended or is past its deadline."""
        self._native.renew()

    def end(self) -> None:
        """Ends the session with one write (expiry 0): everything held under it is free for the
        fleet at once, and its leases are refused locally from now on."""
        self._native.end()

    def claim(self, id: str) -> Lease:
        """Claims STARTED work under the session: unowned work, or a dead session's with fence + 1.
        :class:`LeaseHeld` while the holder's session lives. The lease's ``checkpoint`` and
        ``release`` work as for any lease; its ``renew`` renews the session."""
        return Lease(self._native.claim(id))


class AsyncSession(_SessionView):
    """A worker's session whose methods are coroutines."""

    __slots__ = ()

    async def renew(self) -> None:
        """Extends the session and with it every lease held under it; :class:`LeaseLost` once it
        was taken over, ended or is past its deadline."""
        await self._native.renew_async()

    async def end(self) -> None:
        """Ends the session with one write: everything held under it is free for the fleet."""
        await self._native.end_async()

    async def claim(self, id: str) -> AsyncLease:
        """Claims STARTED work under the session (:class:`LeaseHeld` while the holder's session
        lives); the lease's ``renew`` renews the session."""
        return AsyncLease(await self._native.claim_async(id))
