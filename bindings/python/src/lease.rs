//! `leaselock::lease` for Python: the stored item and the held lease (a core `Hold`, renewed in
//! the background when it comes from `hold()`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use leaselock::worker::decide::should_release;
use leaselock::{Hold, LeaseItem};
use pyo3::prelude::*;

use crate::args::Arg;
use crate::session::SessionShared;
use crate::{awaitable, monotonic_seconds, repr_opt, seconds_left, wait};

/// One stored lease item, as read.
#[pyclass(module = "leaselock._native", name = "LeaseItem", frozen, get_all, eq)]
#[derive(Debug, Clone, PartialEq)]
pub struct PyLeaseItem {
    pub id: String,
    pub desired_state: Option<String>,
    pub url: Option<String>,
    pub owner: Option<String>,
    pub expires_at_ms: Option<u64>,
    pub last_seq: Option<u64>,
    pub fence: u64,
    pub ttl: Option<u64>,
}

impl From<LeaseItem> for PyLeaseItem {
    fn from(i: LeaseItem) -> Self {
        Self {
            id: i.id,
            desired_state: i.desired_state.map(|s| s.as_str().to_string()),
            url: i.url,
            owner: i.owner,
            expires_at_ms: i.expires_at_ms,
            last_seq: i.last_seq,
            fence: i.fence,
            ttl: i.ttl,
        }
    }
}

#[pymethods]
impl PyLeaseItem {
    fn __repr__(&self) -> String {
        format!(
            "LeaseItem(id={:?}, desired_state={}, owner={}, fence={}, expires_at_ms={}, last_seq={})",
            self.id,
            repr_opt(&self.desired_state),
            repr_opt(&self.owner),
            self.fence,
            repr_opt(&self.expires_at_ms),
            repr_opt(&self.last_seq)
        )
    }
}

/// A held lease.
#[pyclass(module = "leaselock._native", name = "Lease", frozen)]
pub struct PyLease {
    hold: Arc<Hold>,
    /// Session mode: the session it was claimed under (its renewal is the session's).
    session: Option<Arc<SessionShared>>,
    /// Set once a release was answered: leaving the scope sends no second one.
    released: Arc<AtomicBool>,
}

impl From<Hold> for PyLease {
    fn from(hold: Hold) -> Self {
        Self { hold: Arc::new(hold), session: None, released: Arc::default() }
    }
}

impl PyLease {
    pub(crate) fn under_session(hold: Arc<Hold>, session: Arc<SessionShared>) -> Self {
        Self { hold, session: Some(session), released: Arc::default() }
    }

    /// Gives the lease up, and remembers that it did.
    async fn release_now(hold: Arc<Hold>, released: Arc<AtomicBool>) -> leaselock::Result<()> {
        hold.release().await?;
        released.store(true, Ordering::Release);
        Ok(())
    }

    /// What leaving a `with` scope does, as Node's `using()` and `await using` do: the lease is
    /// released unless it was lost (core's `should_release`: it is someone else's now) or was
    /// released already; after the deadline, on STOP or on cancellation it is released (the
    /// write is conditional on owner and fence, so it is safe, and the next owner need not wait
    /// for the expiry). A release answered LeaseLost (taken meanwhile) is not an error.
    async fn exit_release(hold: Arc<Hold>, released: Arc<AtomicBool>) -> leaselock::Result<()> {
        if released.load(Ordering::Acquire) || !should_release(hold.cancel_reason()) {
            return Ok(());
        }
        match Self::release_now(hold, released).await {
            Err(leaselock::Error::Lost { .. }) => Ok(()),
            other => other,
        }
    }

    /// Renews the lease, or under a session the session (which moves every lease held under it).
    async fn renew_now(hold: Arc<Hold>, session: Option<Arc<SessionShared>>) -> leaselock::Result<()> {
        match session {
            Some(session) => {
                if !hold.may_act() {
                    return Err(leaselock::Error::Lost { id: hold.current().id });
                }
                session.renew().await
            }
            None => hold.renew().await,
        }
    }
}

/// A sequence number as core takes it (0 to 2^64-1); anything else is refused as `seq`.
pub(crate) fn seq_arg(py: Python<'_>, seq: Arg) -> PyResult<u64> {
    seq.count(py, "seq")
}

#[pymethods]
impl PyLease {
    #[getter]
    fn id(&self) -> String {
        self.hold.current().id
    }
    #[getter]
    fn owner(&self) -> String {
        self.hold.current().owner
    }
    #[getter]
    fn fence(&self) -> u64 {
        self.hold.current().fence
    }
    #[getter]
    fn expires_at_ms(&self) -> u64 {
        self.hold.current().expires_at_ms
    }
    #[getter]
    fn last_seq(&self) -> Option<u64> {
        self.hold.current().last_seq
    }
    #[getter]
    fn url(&self) -> Option<String> {
        self.hold.current().url
    }
    #[getter]
    fn desired_state(&self) -> Option<String> {
        self.hold.current().desired_state.map(|s| s.as_str().to_string())
    }
    /// The local deadline: the `time.monotonic()` reading at which the owner must stop acting.
    #[getter]
    fn deadline(&self, py: Python<'_>) -> PyResult<f64> {
        monotonic_seconds(py, self.hold.deadline_mono_ms())
    }
    /// Seconds left before the deadline, 0.0 once it has passed.
    fn time_left(&self) -> f64 {
        seconds_left(self.hold.deadline_mono_ms())
    }
    #[getter]
    fn cancelled(&self) -> bool {
        self.hold.token().is_cancelled()
    }
    #[getter]
    fn cancel_reason(&self) -> Option<&'static str> {
        self.hold.cancel_reason().map(|r| r.as_str())
    }

    /// Whether the lease is held under a session (session mode).
    #[getter]
    fn in_session(&self) -> bool {
        self.session.is_some()
    }

    fn renew(&self, py: Python<'_>) -> PyResult<()> {
        wait(py, Self::renew_now(self.hold.clone(), self.session.clone()))
    }
    fn checkpoint(&self, py: Python<'_>, seq: Arg) -> PyResult<()> {
        let seq = seq_arg(py, seq)?;
        let hold = self.hold.clone();
        wait(py, async move { hold.checkpoint(seq).await })
    }
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        wait(py, Self::release_now(self.hold.clone(), self.released.clone()))
    }
    fn release_on_exit(&self, py: Python<'_>) -> PyResult<()> {
        wait(py, Self::exit_release(self.hold.clone(), self.released.clone()))
    }

    fn renew_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, Self::renew_now(self.hold.clone(), self.session.clone()))
    }
    fn checkpoint_async<'py>(&self, py: Python<'py>, seq: Arg) -> PyResult<Bound<'py, PyAny>> {
        let seq = seq_arg(py, seq)?;
        let hold = self.hold.clone();
        awaitable(py, async move { hold.checkpoint(seq).await })
    }
    fn release_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, Self::release_now(self.hold.clone(), self.released.clone()))
    }
    fn release_on_exit_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, Self::exit_release(self.hold.clone(), self.released.clone()))
    }
    /// Resolves with the reason once the lease's token fires.
    fn wait_cancelled_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let hold = self.hold.clone();
        awaitable(py, async move {
            hold.cancelled().await;
            Ok(hold.cancel_reason().map(|r| r.as_str()))
        })
    }

    fn __repr__(&self) -> String {
        let l = self.hold.current();
        format!("Lease(id={:?}, owner={:?}, fence={}, last_seq={})", l.id, l.owner, l.fence, repr_opt(&l.last_seq))
    }
}
