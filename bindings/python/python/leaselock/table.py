"""The lease table: :class:`LeaseTable` (blocking) and :class:`AsyncLeaseTable` (asyncio).

Both run every DynamoDB request on the Rust core's tokio runtime with the GIL released, so
threads (blocking API) and coroutines on one event loop (async API) make requests concurrently.
Region, endpoint and credentials come from the usual AWS environment variables and credential
chain unless given.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Dict, List, Mapping, Optional, Sequence, Type

from . import _native
from .errors import LeaseLost, LeaseStopped
from .lease import AsyncLease, Lease, LeaseItem
from .session import AsyncSession, Session, SessionItem

__all__ = ["AsyncHold", "AsyncLeaseTable", "Hold", "LeaseTable"]


class _Table:
    __slots__ = ("_native",)

    def __init__(
        self,
        table_name: str,
        *,
        region: Optional[str] = None,
        endpoint_url: Optional[str] = None,
        lease_ms: int = 20_000,
        renew_ms: int = 5_000,
        clock_skew_ms: int = 1_000,
        key_prefix: str = "",
        index_name: Optional[str] = None,
        owner_index_name: Optional[str] = None,
        attributes: Optional[Mapping[str, str]] = None,
        mode: str = "per-item",
        orphan_shards: int = 1,
        allow_eventual_global_table: bool = False,
        operation_budget_ms: Optional[int] = None,
        operation_attempt_timeout_ms: Optional[int] = None,
    ) -> None:
        """Opens ``table_name`` (no request is made; :meth:`create_table` creates it).

        ``attributes`` renames stored attributes (keys ``id, desired_state, url, owner,
        expires_at_ms, last_seq, fence, ttl``); the defaults are the AWS reference schema.
        ``mode`` is ``"per-item"`` (every held item renewed on its own; ``"item"``, the older
        spelling, is accepted too) or ``"session"`` (one session
        item per worker renewed for everything it holds: :meth:`create_session`, and a
        :class:`Worker` over the table runs in session mode); every process of a table must use
        the same mode. ``orphan_shards`` (1 to 256, default 1: the reference schema's single
        ``STARTED``) spreads running work over that many orphan-index partition values
        (``STARTED#0`` ...), so renewals share their write capacity; every process of a table
        must use the same count. ``index_name`` and ``owner_index_name`` name the orphan index
        and session mode's owner index (defaults ``desired_state-lease_expires_at_ms-index`` and
        ``lease_owner-index``). ``operation_budget_ms`` (default 10,000) is the retry budget of a
        call that holds no lease (start, stop, reads, table creation) and
        ``operation_attempt_timeout_ms`` (default 5,000) the most one attempt of it may take, as
        Rust's ``operation_budget`` / ``operation_attempt_timeout``, Node's ``operationBudgetMs``
        / ``operationAttemptTimeoutMs`` and the CLI's ``--operation-budget-ms``. Bad settings
        raise :class:`InvalidInput` naming the field.

        Before its first claim (:meth:`acquire`, :meth:`hold`, a :class:`Worker`'s start, an
        election) the table is described once (:meth:`check_table`): a global table in
        multi-Region eventual consistency, where writes in two Regions resolve
        last-writer-wins, is refused with :class:`InvalidInput` unless
        ``allow_eventual_global_table=True`` (safe only when every writer of the table writes in
        one Region; nothing is described then).
        """
        self._native = _native.LeaseTable(
            table_name,
            region=region,
            endpoint_url=endpoint_url,
            lease_ms=lease_ms,
            renew_ms=renew_ms,
            clock_skew_ms=clock_skew_ms,
            key_prefix=key_prefix,
            index_name=index_name,
            owner_index_name=owner_index_name,
            attributes=dict(attributes) if isinstance(attributes, Mapping) else attributes,
            mode=mode,
            orphan_shards=orphan_shards,
            allow_eventual_global_table=allow_eventual_global_table,
            operation_budget_ms=operation_budget_ms,
            operation_attempt_timeout_ms=operation_attempt_timeout_ms,
        )

    @property
    def table_name(self) -> str:
        return self._native.table_name

    @property
    def lease_ms(self) -> int:
        """How long a claim or renewal holds the lease."""
        return self._native.lease_ms

    @property
    def renew_ms(self) -> int:
        """How often a held scope renews."""
        return self._native.renew_ms

    @property
    def operation_budget_ms(self) -> int:
        """The retry budget of a call that holds no lease."""
        return self._native.operation_budget_ms

    @property
    def operation_attempt_timeout_ms(self) -> int:
        """The most one attempt of such a call may take."""
        return self._native.operation_attempt_timeout_ms

    @property
    def clock_skew_ms(self) -> int:
        """The largest wall-clock difference tolerated between workers."""
        return self._native.clock_skew_ms

    @property
    def mode(self) -> str:
        """``"per-item"`` or ``"session"``, as the CLI names them."""
        return self._native.mode

    @property
    def orphan_shards(self) -> int:
        """How many orphan-index partition values running work is spread over (1: unsharded)."""
        return self._native.orphan_shards

    @property
    def allow_eventual_global_table(self) -> bool:
        """Whether a global table in multi-Region eventual consistency is accepted."""
        return self._native.allow_eventual_global_table

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.table_name!r})"


class LeaseTable(_Table):
    """Lease operations on one DynamoDB table, blocking (the GIL is released while waiting)."""

    __slots__ = ()

    def create_table(self) -> None:
        """Creates the table, its sparse orphan index and TTL; does nothing if it exists."""
        self._native.create_table()

    def check_table(self) -> str:
        """Whether leases on the table can be exclusive, asked once per table object (one
        DescribeTable; a success is kept): ``"single-region"``, ``"strong"`` (a global table in
        multi-Region strong consistency) or ``"not-checked"`` (``allow_eventual_global_table``).
        A global table in multi-Region eventual consistency raises :class:`InvalidInput`, a
        missing table :class:`TableNotFound`."""
        return self._native.check_table()

    def start(self, id: str, url: str) -> LeaseItem:
        """Marks ``id`` STARTED at ``url`` (``ws://`` or ``wss://``); owner, fence and last_seq stay."""
        return self._native.start(id, url)

    def stop(self, id: str) -> LeaseItem:
        """Marks ``id`` STOPPED; its holder is told at its next renewal."""
        return self._native.stop(id)

    def acquire(self, id: str, owner: str) -> Lease:
        """Claims ``id`` for ``owner`` (:class:`LeaseHeld` names the holder). Not renewed for you:
        see :meth:`hold`."""
        return Lease(self._native.acquire(id, owner))

    def hold(self, id: str, owner: str) -> Hold:
        """``with table.hold(id, owner) as lease:`` claims, renews in the background on the
        lease's schedule and releases on exit. At the deadline, on a lost lease or on STOP the
        lease is cancelled: the next lease call in the block raises :class:`LeaseLost` and
        ``lease.cancelled`` is true. On a ``mode="session"`` table too the scope holds a lease
        renewed on its own (session-mode workers leave it alone until it is released or expires);
        a session is for the many leases of one worker (:meth:`create_session`)."""
        return Hold(self, id, owner)

    def get(self, id: str) -> Optional[LeaseItem]:
        """A strongly consistent read (``None`` without an item)."""
        return self._native.get(id)

    def orphans(self, limit: Optional[int] = None) -> List[LeaseItem]:
        """STARTED items nobody holds (claimable now), oldest expiry first, up to ``limit``."""
        return self._native.orphans(limit)

    def desired_states(self, ids: Sequence[str]) -> Dict[str, Optional[str]]:
        """The desired state of every id (``None`` without an item or a state)."""
        return self._native.desired_states(list(ids))

    def owned_by(self, owner: str) -> List[LeaseItem]:
        """Items whose lease ``owner`` holds now."""
        return self._native.owned_by(owner)

    def create_session(self, owner: str, *, previous_epoch: Optional[int] = None) -> Session:
        """Opens a new epoch of ``owner``'s session (``mode="session"`` only). :class:`LeaseHeld`
        while a session of ``owner`` lives, unless it is ``previous_epoch``, the one this process
        held and stopped acting for."""
        return Session(self._native.create_session(owner, previous_epoch=previous_epoch))

    def sessions(self) -> List[SessionItem]:
        """Every session item, live or dead, oldest expiry first (``mode="session"`` only)."""
        return self._native.sessions()


class AsyncLeaseTable(_Table):
    """Lease operations on one DynamoDB table as coroutines; many may run at once on one loop."""

    __slots__ = ()

    async def create_table(self) -> None:
        """Creates the table, its sparse orphan index and TTL; does nothing if it exists."""
        await self._native.create_table_async()

    async def check_table(self) -> str:
        """Whether leases on the table can be exclusive; see :meth:`LeaseTable.check_table`."""
        return await self._native.check_table_async()

    async def start(self, id: str, url: str) -> LeaseItem:
        """Marks ``id`` STARTED at ``url``; owner, fence and last_seq stay."""
        return await self._native.start_async(id, url)

    async def stop(self, id: str) -> LeaseItem:
        """Marks ``id`` STOPPED; its holder is told at its next renewal."""
        return await self._native.stop_async(id)

    async def acquire(self, id: str, owner: str) -> AsyncLease:
        """Claims ``id`` for ``owner`` (:class:`LeaseHeld` names the holder); not renewed for you."""
        return AsyncLease(await self._native.acquire_async(id, owner))

    def hold(self, id: str, owner: str) -> AsyncHold:
        """``async with table.hold(id, owner) as lease:`` claims, renews in the background and
        releases on exit. At the deadline, on a lost lease or on STOP the task running the block
        is cancelled, and the ``async with`` raises :class:`LeaseLost` (:class:`LeaseStopped` for
        STOP) in place of the cancellation."""
        return AsyncHold(self, id, owner)

    async def get(self, id: str) -> Optional[LeaseItem]:
        """A strongly consistent read (``None`` without an item)."""
        return await self._native.get_async(id)

    async def orphans(self, limit: Optional[int] = None) -> List[LeaseItem]:
        """STARTED items nobody holds (claimable now), oldest expiry first, up to ``limit``."""
        return await self._native.orphans_async(limit)

    async def desired_states(self, ids: Sequence[str]) -> Dict[str, Optional[str]]:
        """The desired state of every id (``None`` without an item or a state)."""
        return await self._native.desired_states_async(list(ids))

    async def owned_by(self, owner: str) -> List[LeaseItem]:
        """Items whose lease ``owner`` holds now."""
        return await self._native.owned_by_async(owner)

    async def create_session(self, owner: str, *, previous_epoch: Optional[int] = None) -> AsyncSession:
        """Opens a new epoch of ``owner``'s session (``mode="session"`` only); see
        :meth:`LeaseTable.create_session`."""
        return AsyncSession(await self._native.create_session_async(owner, previous_epoch=previous_epoch))

    async def sessions(self) -> List[SessionItem]:
        """Every session item, live or dead, oldest expiry first (``mode="session"`` only)."""
        return await self._native.sessions_async()


class Hold:
    """The scope of :meth:`LeaseTable.hold`."""

    __slots__ = ("_table", "_id", "_owner", "_lease")

    def __init__(self, table: LeaseTable, id: str, owner: str) -> None:
        self._table, self._id, self._owner = table, id, owner
        self._lease: Optional[Lease] = None

    def __enter__(self) -> Lease:
        self._lease = Lease(self._table._native.hold(self._id, self._owner))
        return self._lease

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if self._lease is not None:
            self._lease.__exit__(exc_type, exc, tb)


class AsyncHold:
    """The scope of :meth:`AsyncLeaseTable.hold`."""

    __slots__ = ("_table", "_id", "_owner", "_lease", "_watch", "_fired", "_exiting", "_task")

    def __init__(self, table: AsyncLeaseTable, id: str, owner: str) -> None:
        self._table, self._id, self._owner = table, id, owner
        self._lease: Optional[AsyncLease] = None
        self._watch: Optional[asyncio.Future[Optional[str]]] = None
        self._fired: Optional[str] = None
        self._exiting = False
        self._task: Optional[asyncio.Task[object]] = None

    async def __aenter__(self) -> AsyncLease:
        native = await self._table._native.hold_async(self._id, self._owner)
        self._lease = AsyncLease(native)
        self._task = asyncio.current_task()
        self._watch = asyncio.ensure_future(native.wait_cancelled_async())
        self._watch.add_done_callback(self._on_lease_end)
        return self._lease

    def _on_lease_end(self, watch: asyncio.Future[Optional[str]]) -> None:
        if self._exiting or watch.cancelled() or watch.exception() is not None or self._task is None:
            return
        reason = watch.result()
        if reason in (None, "Released"):
            return  # The block released the lease itself: there is nothing to interrupt.
        self._fired = reason
        self._task.cancel(f"lease on {self._id} ended: {self._fired}")

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self._exiting = True
        if self._watch is not None:
            self._watch.cancel()
        if self._lease is not None:
            await self._lease.__aexit__(exc_type, exc, tb)
        if self._fired is not None and exc_type is asyncio.CancelledError:
            if self._task is not None and hasattr(self._task, "uncancel"):
                self._task.uncancel()
            error = LeaseStopped if self._fired == "Stopped" else LeaseLost
            raise error(f"lease on {self._id} ended: {self._fired}") from exc
