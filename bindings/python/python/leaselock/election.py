"""Leader election: core's Rust elector claims, renews and releases; your coroutine leads.

>>> elector = LeaderElector(LeaseTable("leases"), "host-a")  # doctest: +SKIP
>>> async def report(term: Term) -> int:
...     return term.fence
>>> outcome = await elector.run_if_leader("nightly-report", report)  # doctest: +SKIP
>>> outcome.led, outcome.value  # doctest: +SKIP
(True, 1)

The backend is a :class:`LeaseTable` (the leader lease is an item ``{prefix}leader/{name}``,
candidates live in the same table) or a :class:`RedisElection`. The elected coroutine runs as
its own task on the caller's event loop and gets a :class:`Term` (``.fence``, strictly
increasing across the leaders of one name). The lease is renewed and its deadline enforced in
Rust, off the event loop: the task is cancelled (``asyncio.CancelledError``) when the lease is
lost or its local deadline passes, before anyone else can be elected. Three forms:

- ``await elector.run_if_leader(name, fn)`` (and ``run_if_slot``, ``run_if_elected``) returns
  an :class:`Outcome`: ``led`` with the ``fence``, the coroutine's ``value`` and how the term
  ``end``-ed, or ``skipped`` with the ``holder``. What the coroutine raises is raised here,
  after the lease is released.
- ``@elector.leader(name)`` turns ``async def fn(term, *args)`` into ``async def fn(*args) ->
  Outcome``.
- ``async with elector.lead(name) as term:`` runs the block as the leader; ``term`` is ``None``
  when someone else leads (the holder is then in ``.outcome.holder``). When the term ends
  early, the block is cancelled and the ``async with`` raises :class:`LeaseLost`.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, Set, Tuple, Union

from . import _native
from .errors import LeaseLost
from .table import AsyncLeaseTable, LeaseTable

Term = _native.Term
"""What an elected coroutine is handed: ``fence``, ``key``, ``slot``, ``deadline`` (the
:func:`time.monotonic` reading at which the term ends), ``time_left()`` (seconds until then, 0.0
once past), ``cancelled``."""

RedisElection = _native.RedisElection
"""The Redis election store: ``RedisElection(url, *, lease_ms=20_000, renew_ms=5_000,
clock_skew_ms=1_000, key_prefix="leaselock:")``; connects at once."""

__all__ = ["Candidate", "Lead", "LeaderElector", "Outcome", "RedisElection", "Term"]

Action = Callable[[Term], Awaitable[Any]]
Elected = Callable[..., Awaitable[Any]]
Strategy = Union[str, Tuple[str, str]]


class Outcome:
    """What a ``run_if_*`` call did: ``led`` (``fence``, ``value``, ``end``: ``"finished"``,
    ``"lost"`` or ``"stepped_down"``) or ``skipped`` (``holder``, when known).

    ``value`` is what the coroutine returned; ``None`` when it was cancelled (``end`` is then
    ``"lost"`` or ``"stepped_down"``).
    """

    __slots__ = ("fence", "value", "end", "holder")

    def __init__(self, fence: Optional[int], value: Any, end: Optional[str], holder: Optional[str]) -> None:
        self.fence = fence
        self.value = value
        self.end = end
        self.holder = holder

    @property
    def led(self) -> bool:
        return self.fence is not None

    @property
    def skipped(self) -> bool:
        return self.fence is None

    def __repr__(self) -> str:
        if self.led:
            return f"Outcome(led, fence={self.fence}, end={self.end!r}, value={self.value!r})"
        return f"Outcome(skipped, holder={self.holder!r})"


class Candidate:
    """A strategic election's candidate: ``score`` (higher wins ``"highest_score"``), ``load``
    (lower wins ``"least_loaded"``) and free-form ``metadata``."""

    __slots__ = ("score", "load", "metadata")

    def __init__(self, score: float = 0.0, *, load: float = 0.0, metadata: Optional[Dict[str, str]] = None) -> None:
        self.score = score
        self.load = load
        # Anything but a mapping is passed on as given, to be refused as `metadata`.
        self.metadata: Dict[str, str] = {} if metadata is None else dict(metadata) if isinstance(metadata, Mapping) else metadata


class _Running:
    """One elected task; started and cancelled from Rust threads, run on the caller's loop."""

    __slots__ = ("_loop", "_task", "_abandoned")

    def __init__(self, loop: asyncio.AbstractEventLoop, fn: Action, term: Term, on_done: Callable[[], None]) -> None:
        self._loop = loop
        self._task: Optional[asyncio.Task[Any]] = None
        self._abandoned = False
        loop.call_soon_threadsafe(self._begin, fn, term, on_done)

    def _begin(self, fn: Action, term: Term, on_done: Callable[[], None]) -> None:
        if self._abandoned:
            on_done()
            return

        async def call() -> Any:
            return await fn(term)

        self._task = self._loop.create_task(call(), name=f"leaselock:{term.key}")
        self._task.add_done_callback(lambda _: on_done())

    def cancel(self) -> None:
        """Thread-safe: cancels the task (queued after its start, so it always lands)."""
        self._loop.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:
        if self._task is not None:
            self._task.cancel("the term ended")

    def cancel_now(self) -> None:
        """On the loop: cancels the task (or its start) because the caller was cancelled."""
        self._abandoned = True
        if self._task is not None:
            self._task.cancel()

    def value(self) -> Any:
        """The coroutine's return value; re-raises what it raised; ``None`` if it was cancelled."""
        if self._task is None or self._task.cancelled():
            return None
        return self._task.result()


async def _run(call: Callable[[Callable[..., Any]], Awaitable[Tuple[Any, Any, Any]]], fn: Action) -> Outcome:
    loop = asyncio.get_running_loop()
    runs: List[_Running] = []

    def start(term: Term, on_done: Callable[[], None]) -> _Running:
        run = _Running(loop, fn, term, on_done)
        runs.append(run)
        return run

    pending = asyncio.ensure_future(call(start))
    try:
        fence, end, holder = await asyncio.shield(pending)
    except asyncio.CancelledError:
        # The caller was cancelled: end the action, let the core release, then give up.
        for run in runs:
            run.cancel_now()
        await asyncio.wait({pending})
        raise
    value = runs[0].value() if runs else None
    return Outcome(fence, value, end, holder)


class LeaderElector:
    """Runs coroutines only while this process holds an election lease.

    ``backend`` is a :class:`LeaseTable` / :class:`AsyncLeaseTable` (its lease timing and key
    prefix apply) or a :class:`RedisElection`. ``candidate_id`` is what this process claims as
    (unique per process). The options are those of Rust's ``ElectionOptions`` and Node's
    ``LeaderElector``, in the same order: ``wait_ms``: how long to keep trying before giving up
    as skipped (0: one try); ``min_lease_ms``: keep the lease at least this long after the claim,
    so a job run on every host runs once per period; ``key_prefix``: before every election key;
    ``retry_delay_ms``: pause between tries (default 200; ``retry_ms`` is its older name, still
    accepted); ``term_ms``: how often a strategic leader asks the strategy again (default: the
    lease); ``candidate_ttl_ms``: how long a strategic candidate's registration lives without a
    refresh (default: the lease). Bad settings raise :class:`InvalidInput` naming the argument.
    """

    def __init__(
        self,
        backend: Union[LeaseTable, AsyncLeaseTable, RedisElection],
        candidate_id: str,
        *,
        wait_ms: int = 0,
        min_lease_ms: int = 0,
        key_prefix: str = "",
        retry_delay_ms: Optional[int] = None,
        term_ms: Optional[int] = None,
        candidate_ttl_ms: Optional[int] = None,
        retry_ms: Optional[int] = None,
    ) -> None:
        native_backend = getattr(backend, "_native", backend)
        # The retry delay is passed only as given (None: the default; both names: refused).
        retry: Dict[str, int] = {}
        if retry_delay_ms is not None:
            retry["retry_delay_ms"] = retry_delay_ms
        if retry_ms is not None:
            retry["retry_ms"] = retry_ms
        self._native = _native.LeaderElector(
            native_backend,
            candidate_id,
            wait_ms=wait_ms,
            min_lease_ms=min_lease_ms,
            key_prefix=key_prefix,
            term_ms=term_ms,
            candidate_ttl_ms=candidate_ttl_ms,
            **retry,
        )

    @property
    def candidate_id(self) -> str:
        return self._native.candidate_id

    async def run_if_leader(self, name: str, fn: Action) -> Outcome:
        """Runs ``await fn(term)`` only if this process becomes the leader of ``name``."""
        return await _run(lambda start: self._native.run_if_leader_async(name, start), fn)

    async def run_if_slot(self, name: str, slots: int, fn: Action) -> Outcome:
        """Runs ``await fn(term)`` only if this process gets one of the ``slots`` slots of ``name``
        (``term.slot`` says which)."""
        return await _run(lambda start: self._native.run_if_slot_async(name, slots, start), fn)

    async def run_if_elected(
        self, name: str, fn: Action, *, candidate: Optional[Candidate] = None, strategy: Strategy = "highest_score"
    ) -> Outcome:
        """Strategic election: registers ``candidate`` while the call runs; only when ``strategy``
        (``"highest_score"``, ``"least_loaded"`` or ``("preferred", candidate_id)``) picks this
        process does it compete for ``name``. A leader steps down at a term boundary
        (``end == "stepped_down"``, the task cancelled) when a better candidate appears."""
        c = candidate or Candidate()
        if isinstance(strategy, tuple):
            kind, preferred = strategy
        else:
            kind, preferred = strategy, None
        return await _run(
            lambda start: self._native.run_if_elected_async(
                name, start, score=c.score, load=c.load, metadata=c.metadata, strategy=kind, preferred=preferred
            ),
            fn,
        )

    def leader(self, name: str, *, slots: Optional[int] = None) -> Callable[[Elected], Callable[..., Awaitable[Outcome]]]:
        """Decorator: ``async def fn(term, *args, **kwargs)`` becomes ``async def fn(*args,
        **kwargs) -> Outcome`` that runs it only when elected for ``name`` (one of ``slots``
        when given)."""

        def decorate(fn: Elected) -> Callable[..., Awaitable[Outcome]]:
            @functools.wraps(fn)
            async def elected(*args: Any, **kwargs: Any) -> Outcome:
                def action(term: Term) -> Awaitable[Any]:
                    return fn(term, *args, **kwargs)

                if slots is None:
                    return await self.run_if_leader(name, action)
                return await self.run_if_slot(name, slots, action)

            return elected

        return decorate

    def lead(self, name: str, *, slots: Optional[int] = None) -> "Lead":
        """``async with elector.lead(name) as term:`` (see :class:`Lead`)."""
        return Lead(self, name, slots)


class Lead:
    """``async with elector.lead(name) as term:`` runs the block as the leader of ``name``.

    ``term`` is ``None`` when someone else leads (``.outcome.holder`` names them) and the block
    should do nothing. While the block runs the lease is renewed; if the term ends early (lease
    lost, deadline passed) the block is cancelled and the ``async with`` raises
    :class:`LeaseLost`. On leaving the block the lease is released (or kept to ``min_lease_ms``).
    ``.outcome`` is set once the block is left.
    """

    def __init__(self, elector: LeaderElector, name: str, slots: Optional[int]) -> None:
        self._elector = elector
        self._name = name
        self._slots = slots
        self._pending: Optional[asyncio.Future[Tuple[Any, Any, Any]]] = None
        self._exit: Optional[asyncio.Event] = None
        self._body: Optional[asyncio.Task[Any]] = None
        self._exiting = False
        self._lost = False
        self.term: Optional[Term] = None
        self.outcome: Optional[Outcome] = None

    async def __aenter__(self) -> Optional[Term]:
        loop = asyncio.get_running_loop()
        self._body = asyncio.current_task()
        self._exit = asyncio.Event()
        entered: asyncio.Future[Term] = loop.create_future()
        exit_event = self._exit

        def start(term: Term, on_done: Callable[[], None]) -> "_LeadRun":
            return _LeadRun(self, loop, exit_event, term, entered, on_done)

        native = self._elector._native
        if self._slots is None:
            self._pending = asyncio.ensure_future(native.run_if_leader_async(self._name, start))
        else:
            self._pending = asyncio.ensure_future(native.run_if_slot_async(self._name, self._slots, start))
        waiters: Set["asyncio.Future[Any]"] = {entered, self._pending}
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        if entered.done():
            self.term = entered.result()
            return self.term
        fence, end, holder = self._pending.result()
        self.outcome = Outcome(fence, None, end, holder)
        return None

    def _term_ended(self) -> None:
        """On the loop: the term is over; cancels the block unless it is already being left."""
        if not self._exiting and self._body is not None:
            self._lost = True
            self._body.cancel("the term ended")

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> Optional[bool]:
        if self.term is None or self._pending is None or self._exit is None:
            return None
        self._exiting = True
        self._exit.set()
        # A cancelled caller leaves at once; the core still releases (the block has ended).
        fence, end, holder = await asyncio.shield(self._pending)
        self.outcome = Outcome(fence, None, end, holder)
        if self._lost:
            _uncancel(self._body)
            error = LeaseLost(f"the term of {self.term.key} ended before the block did")
            error.id = self.term.key
            raise error
        return None


def _uncancel(task: Optional[asyncio.Task[Any]]) -> None:
    uncancel = getattr(task, "uncancel", None)  # Python 3.11+
    if uncancel is not None:
        uncancel()


class _LeadRun:
    """The elected 'action' of a ``Lead``: waits for the block to end; the term's end cancels
    the block itself."""

    __slots__ = ("_lead", "_loop", "_task")

    def __init__(
        self,
        lead: Lead,
        loop: asyncio.AbstractEventLoop,
        exit_event: asyncio.Event,
        term: Term,
        entered: "asyncio.Future[Term]",
        on_done: Callable[[], None],
    ) -> None:
        self._lead = lead
        self._loop = loop
        self._task: Optional[asyncio.Task[Any]] = None
        loop.call_soon_threadsafe(self._begin, exit_event, term, entered, on_done)

    def _begin(
        self, exit_event: asyncio.Event, term: Term, entered: "asyncio.Future[Term]", on_done: Callable[[], None]
    ) -> None:
        self._task = self._loop.create_task(exit_event.wait(), name=f"leaselock:{term.key}")
        self._task.add_done_callback(lambda _: on_done())
        if not entered.done():
            entered.set_result(term)

    def cancel(self) -> None:
        self._loop.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:
        self._lead._term_ended()
        if self._task is not None:
            self._task.cancel()
