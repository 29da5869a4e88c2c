"""The lease worker: core's Rust worker claims, renews and releases; your coroutine streams.

>>> worker = Worker(LeaseTable("leases"), max_connections=100)  # doctest: +SKIP
>>> @worker.handler
... async def handle(conn: Connection) -> None:
...     seq = conn.last_seq or 0
...     while True:
...         seq = await next_message(conn.url, after=seq)
...         await conn.checkpoint(seq)
>>> worker.run()  # until SIGTERM or SIGINT  # doctest: +SKIP

One handler task runs per held lease, on the event loop that serves the worker. The task is
cancelled (``asyncio.CancelledError``, the reason in ``conn.cancel_reason`` and in the error's
message) at the lease's local deadline, when the lease is lost, when the work is STOPPED and on
shutdown. The lease itself is renewed and its deadline enforced in Rust, off the event loop: a
handler that blocks the loop or raises cannot keep a lease past its deadline nor stop the
worker; one that ignores its cancellation for ``handler_grace_ms`` is abandoned and its lease
released, and every lease call it makes afterwards raises :class:`LeaseLost`.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any, Awaitable, Callable, Dict, List, Optional, Union

from . import _native
from .table import AsyncLeaseTable, LeaseTable

WorkerSnapshot = _native.WorkerSnapshot
"""A point-in-time view of a worker: ``worker_id, held, acquired, released, leases_lost,
handler_errors, ...``."""

__all__ = ["Connection", "Worker", "WorkerSnapshot"]

Handler = Callable[["Connection"], Awaitable[None]]

# Core's defaults (the Rust builder's and Node's too); their limits are checked there as well.
_DEFAULTS = _native.WORKER_DEFAULTS


class Connection:
    """One leased unit of work, handed to the handler."""

    __slots__ = ("_native",)

    def __init__(self, native: _native.Connection) -> None:
        self._native = native

    @property
    def id(self) -> str:
        """The work's id (``connection_id``)."""
        return self._native.id

    @property
    def url(self) -> Optional[str]:
        """Where to connect (``ws_url``)."""
        return self._native.url

    @property
    def last_seq(self) -> Optional[int]:
        """The last sequence number checkpointed when the lease was claimed: resume after it."""
        return self._native.last_seq

    @property
    def fence(self) -> int:
        """This claim's fencing token; downstream writes conditional on it fail after a takeover."""
        return self._native.fence

    @property
    def deadline(self) -> float:
        """The local deadline: the :func:`time.monotonic` reading at which the worker must stop
        acting for the work."""
        return self._native.deadline

    def time_left(self) -> float:
        """Seconds left before :attr:`deadline`, 0.0 once past."""
        return self._native.time_left()

    def now_ms(self) -> int:
        """The store's time now (epoch ms), as the worker measures it from DynamoDB's answers: stamp
        what the handler writes with it, so stamps agree across the fleet whatever each host's
        clock says."""
        return self._native.now_ms()

    @property
    def cancelled(self) -> bool:
        """True once the handler must stop."""
        return self._native.cancelled

    @property
    def cancel_reason(self) -> Optional[str]:
        """``"Deadline"``, ``"Lost"``, ``"Stopped"``, ``"Shutdown"`` or ``"Released"`` once cancelled."""
        return self._native.cancel_reason

    async def checkpoint(self, seq: int) -> None:
        """Records ``seq`` as processed, under the lease and only forward."""
        await self._native.checkpoint_async(seq)

    async def fenced_write(self, writes: List[Dict[str, Any]]) -> None:
        """Applies ``writes`` (boto3 ``TransactItems`` entries: ``{"Put": {...}}``, ``{"Update": ...}``,
        ``{"Delete": ...}``, ``{"ConditionCheck": ...}``) in one transaction with a check that the
        lease is still ours; :class:`LeaseLost` (and nothing written) otherwise."""
        await self._native.fenced_write_async(writes)

    async def fenced_write_with_checkpoint(self, seq: int, writes: List[Dict[str, Any]]) -> None:
        """Applies ``writes`` and the checkpoint ``seq`` in one transaction under the lease: the
        output and the resume point move together or not at all."""
        await self._native.fenced_write_with_checkpoint_async(seq, writes)

    def __repr__(self) -> str:
        return repr(self._native)


class _Running:
    """One handler task; started and cancelled from Rust threads, run on the worker's loop."""

    __slots__ = ("_loop", "_task")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        handler: Handler,
        conn: Connection,
        on_done: Callable[[Optional[str]], None],
    ) -> None:
        self._loop = loop
        self._task: Optional[asyncio.Task[None]] = None
        loop.call_soon_threadsafe(self._begin, handler, conn, on_done)

    def _begin(self, handler: Handler, conn: Connection, on_done: Callable[[Optional[str]], None]) -> None:
        async def call() -> None:
            await handler(conn)

        self._task = self._loop.create_task(call(), name=f"leaselock:{conn.id}")
        self._task.add_done_callback(lambda task: on_done(_failure(task)))

    def cancel(self, reason: str) -> None:
        """Thread-safe: cancels the task (queued after its start, so it always lands)."""
        self._loop.call_soon_threadsafe(self._cancel, reason)

    def _cancel(self, reason: str) -> None:
        if self._task is not None:
            self._task.cancel(reason)


def _failure(task: asyncio.Task[None]) -> Optional[str]:
    """What the handler raised (``None`` when it returned or ended by its cancellation)."""
    if task.cancelled():
        return None
    error = task.exception()
    return None if error is None else f"{type(error).__name__}: {error}"


class Worker:
    """Holds up to ``max_connections`` leases and runs ``@worker.handler`` once per held lease.

    ``table`` is a :class:`LeaseTable` or :class:`AsyncLeaseTable`; ``queue_url`` an SQS queue
    of START hints (optional: the orphan index finds work without it). Timing knobs are in
    milliseconds with the design's defaults (core's: ``_native.WORKER_DEFAULTS``; the metrics
    namespace is ``leaselock`` unless given). On a session-mode table the worker balances the
    fleet's work (claims up to its fair share, hands the excess over; ``conn.cancel_reason``
    is then ``"HandOver"``) unless ``balance=False``; ``index_lag_ms`` is how far behind the
    table its owner index may be (a dead session's empty listing is trusted only when sent that
    long after its last write). Claims wait until the store's clock (measured from DynamoDB's
    answers) is known within ``clock_tolerance_ms`` (default: half the table's clock skew); the
    worker keeps what it holds meanwhile, and its snapshot says why (``claims_paused``) and what
    was measured (``clock_offset_ms``, ``clock_uncertainty_ms``). ``wait_for_store_clock=False``
    claims on the host's clock until the store's is known. Bad settings raise :class:`InvalidInput`.
    :meth:`serve` checks the table first (:meth:`LeaseTable.check_table`): a global table in
    multi-Region eventual consistency raises :class:`InvalidInput` before anything is claimed.
    """

    def __init__(
        self,
        table: Union[LeaseTable, AsyncLeaseTable],
        *,
        queue_url: Optional[str] = None,
        max_connections: int = _DEFAULTS.max_connections,
        worker_id: Optional[str] = None,
        orphan_interval_ms: int = _DEFAULTS.orphan_interval_ms,
        desired_state_interval_ms: int = _DEFAULTS.desired_state_interval_ms,
        metrics_interval_ms: int = _DEFAULTS.metrics_interval_ms,
        handler_grace_ms: int = _DEFAULTS.handler_grace_ms,
        hint_wait_ms: int = _DEFAULTS.hint_wait_ms,
        index_lag_ms: int = _DEFAULTS.index_lag_ms,
        metrics_namespace: Optional[str] = None,
        balance: bool = _DEFAULTS.balance,
        clock_tolerance_ms: Optional[int] = None,
        wait_for_store_clock: bool = _DEFAULTS.wait_for_store_clock,
    ) -> None:
        self._native = _native.Worker(
            getattr(table, "_native", table),  # type: ignore[arg-type]  # anything else is refused as `table`
            queue_url=queue_url,
            max_connections=max_connections,
            worker_id=worker_id,
            orphan_interval_ms=orphan_interval_ms,
            desired_state_interval_ms=desired_state_interval_ms,
            metrics_interval_ms=metrics_interval_ms,
            handler_grace_ms=handler_grace_ms,
            hint_wait_ms=hint_wait_ms,
            index_lag_ms=index_lag_ms,
            metrics_namespace=metrics_namespace,
            balance=balance,
            clock_tolerance_ms=clock_tolerance_ms,
            wait_for_store_clock=wait_for_store_clock,
        )
        self._handler: Optional[Handler] = None

    def handler(self, fn: Handler) -> Handler:
        """Decorator: ``async def handle(conn: Connection)`` runs once per claimed lease; its
        return (or exception) releases the lease."""
        self._handler = fn
        return fn

    @property
    def worker_id(self) -> str:
        """The owner name this worker writes into leases."""
        return self._native.worker_id

    def snapshot(self) -> WorkerSnapshot:
        """Counters and held ids, now."""
        return self._native.snapshot()

    def shutdown(self) -> None:
        """Stops claiming, cancels every handler and releases every lease (thread-safe)."""
        self._native.shutdown()

    async def serve(self) -> WorkerSnapshot:
        """Runs on the current event loop until :meth:`shutdown`; returns the final snapshot.
        Cancelling the task that awaits it shuts the worker down cleanly first."""
        handler = self._handler
        if handler is None:
            raise TypeError("no handler: decorate a coroutine function with @worker.handler")
        loop = asyncio.get_running_loop()

        def start(native: _native.Connection, on_done: Callable[[Optional[str]], None]) -> _Running:
            return _Running(loop, handler, Connection(native), on_done)

        served = asyncio.ensure_future(self._native.serve_async(start))
        try:
            return await asyncio.shield(served)
        except asyncio.CancelledError:
            self.shutdown()
            await served
            raise

    def run(self) -> WorkerSnapshot:
        """Blocks in a new event loop until SIGTERM or SIGINT, then shuts down cleanly."""

        async def main() -> WorkerSnapshot:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.shutdown)
            return await self.serve()

        return asyncio.run(main())
