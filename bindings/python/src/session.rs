//! Session mode for Python: a worker's session (`session/{owner}`, one item renewed for every
//! connection held under it) and the claims made under it, over core's session operations.
//!
//! A lease claimed under a session is a core `Hold` in session mode (`Hold::in_session`: its
//! holder machine renews nothing): each session renewal moves the deadline of every lease held
//! under it (`Hold::cover`), and a lost or ended session ends them (`Hold::session_lost`,
//! `Hold::session_ended`), so their checkpoints are refused locally from then on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use leaselock::{Error, Hold, LeaseStore, Session, SessionItem};
use pyo3::prelude::*;

use crate::args::Arg;

use crate::lease::PyLease;
use crate::{awaitable, monotonic_seconds, seconds_left, wait};

/// One session item, as listed.
#[pyclass(module = "leaselock._native", name = "SessionItem", frozen, get_all, eq)]
#[derive(Debug, Clone, PartialEq)]
pub struct PySessionItem {
    pub owner: String,
    pub epoch: u64,
    pub expires_at_ms: u64,
}

impl From<SessionItem> for PySessionItem {
    fn from(s: SessionItem) -> Self {
        Self { owner: s.owner, epoch: s.epoch, expires_at_ms: s.expires_at_ms }
    }
}

#[pymethods]
impl PySessionItem {
    fn __repr__(&self) -> String {
        format!("SessionItem(owner={:?}, epoch={}, expires_at_ms={})", self.owner, self.epoch, self.expires_at_ms)
    }
}

/// A session and the leases claimed under it.
pub(crate) struct SessionShared {
    store: Arc<dyn LeaseStore>,
    /// Renewals and the end take turns on the session.
    session: tokio::sync::Mutex<Session>,
    /// A copy after the last successful write (readable without waiting).
    current: Mutex<Session>,
    held: Mutex<Vec<Weak<Hold>>>,
    ended: AtomicBool,
}

impl SessionShared {
    fn new(store: Arc<dyn LeaseStore>, session: Session) -> Self {
        Self {
            store,
            current: Mutex::new(session.clone()),
            session: tokio::sync::Mutex::new(session),
            held: Mutex::default(),
            ended: AtomicBool::new(false),
        }
    }

    fn current(&self) -> Session {
        self.current.lock().expect("session poisoned").clone()
    }

    fn lost(&self) -> Error {
        Error::Lost { id: self.store.config().session_id(&self.current().owner) }
    }

    /// Calls `f` on every lease still held under the session (and forgets the dropped ones).
    fn each_held(&self, f: impl Fn(&Hold)) {
        let mut held = self.held.lock().expect("session poisoned");
        held.retain(|h| match h.upgrade() {
            Some(hold) => {
                f(&hold);
                true
            }
            None => false,
        });
    }

    pub(crate) async fn renew(&self) -> leaselock::Result<()> {
        if self.ended.load(Ordering::SeqCst) {
            return Err(self.lost());
        }
        let mut session = self.session.lock().await;
        let mut renewing = session.clone();
        match self.store.renew_session(&mut renewing).await {
            Ok(()) => {
                *session = renewing.clone();
                *self.current.lock().expect("session poisoned") = renewing;
                self.each_held(|h| h.cover(session.deadline_mono_ms));
                Ok(())
            }
            Err(e) => {
                if matches!(e, Error::Lost { .. }) {
                    self.each_held(Hold::session_lost);
                }
                Err(e)
            }
        }
    }

    async fn end(&self) -> leaselock::Result<()> {
        let session = self.session.lock().await;
        self.ended.store(true, Ordering::SeqCst);
        // Whatever the answer, nothing acts under this session any more.
        self.each_held(Hold::session_ended);
        self.store.end_session(&session).await
    }

    async fn claim(self: Arc<Self>, id: String) -> leaselock::Result<PyLease> {
        if self.ended.load(Ordering::SeqCst) {
            return Err(self.lost());
        }
        let lease = self.store.claim_in_session(&id, &self.current()).await?;
        let hold = Arc::new(Hold::in_session(self.store.clone(), lease));
        // A renewal that landed while the claim was in flight covers it too (same epoch).
        hold.cover(self.current().deadline_mono_ms);
        self.held.lock().expect("session poisoned").push(Arc::downgrade(&hold));
        if self.ended.load(Ordering::SeqCst) {
            hold.session_ended();
        }
        Ok(PyLease::under_session(hold, self.clone()))
    }
}

/// Opens a session of `owner` on `store`.
pub(crate) async fn create(
    store: Arc<dyn LeaseStore>,
    owner: String,
    previous_epoch: Option<u64>,
) -> leaselock::Result<PySession> {
    let session = store.create_session(&owner, previous_epoch).await?;
    Ok(PySession { shared: Arc::new(SessionShared::new(store, session)) })
}

/// A worker's session.
#[pyclass(module = "leaselock._native", name = "Session", frozen)]
pub struct PySession {
    shared: Arc<SessionShared>,
}

#[pymethods]
impl PySession {
    #[getter]
    fn owner(&self) -> String {
        self.shared.current().owner
    }
    #[getter]
    fn epoch(&self) -> u64 {
        self.shared.current().epoch
    }
    #[getter]
    fn expires_at_ms(&self) -> u64 {
        self.shared.current().expires_at_ms
    }
    /// The session's local deadline: the `time.monotonic()` reading at which everything held
    /// under it must stop acting.
    #[getter]
    fn deadline(&self, py: Python<'_>) -> PyResult<f64> {
        monotonic_seconds(py, self.shared.current().deadline_mono_ms)
    }
    /// Seconds left before the session's deadline, 0.0 once it has passed.
    fn time_left(&self) -> f64 {
        seconds_left(self.shared.current().deadline_mono_ms)
    }

    fn renew(&self, py: Python<'_>) -> PyResult<()> {
        let shared = self.shared.clone();
        wait(py, async move { shared.renew().await })
    }
    fn end(&self, py: Python<'_>) -> PyResult<()> {
        let shared = self.shared.clone();
        wait(py, async move { shared.end().await })
    }
    fn claim(&self, py: Python<'_>, id: Arg) -> PyResult<PyLease> {
        let id = id.text(py, "id")?;
        wait(py, self.shared.clone().claim(id))
    }

    fn renew_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let shared = self.shared.clone();
        awaitable(py, async move { shared.renew().await })
    }
    fn end_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let shared = self.shared.clone();
        awaitable(py, async move { shared.end().await })
    }
    fn claim_async<'py>(&self, py: Python<'py>, id: Arg) -> PyResult<Bound<'py, PyAny>> {
        let id = id.text(py, "id")?;
        let shared = self.shared.clone();
        awaitable(py, shared.claim(id))
    }

    fn __repr__(&self) -> String {
        let s = self.shared.current();
        format!("Session(owner={:?}, epoch={}, expires_at_ms={})", s.owner, s.epoch, s.expires_at_ms)
    }
}
