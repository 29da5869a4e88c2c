//! How an operation run on the tokio runtime hands its outcome back to an asyncio event loop.
//!
//! Each event loop gets one `LoopWaker`: a queue of finished operations and a socket pair whose
//! read end the loop watches (`loop.add_reader`). A tokio task that finishes pushes its outcome
//! onto the queue without the GIL, and writes one byte only when the queue was idle, so a burst
//! of completions costs one wake-up. The loop's reader then drains the queue on the loop thread,
//! converting each outcome to Python and resolving its future there. No tokio thread ever takes
//! the GIL (no thread state is created per completion, no GIL hand-over to the loop thread), and
//! no `call_soon_threadsafe` handle is made per call.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::FutureExt;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyWeakrefReference;
use pyo3::{intern, IntoPyObjectExt};

use crate::errors;

/// The outcome of one operation, turned into Python on the loop thread.
type Finish = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

struct Done {
    fut: Py<PyAny>,
    finish: Finish,
}

/// What the tokio side shares with one event loop.
pub(crate) struct Shared {
    queue: Mutex<Vec<Done>>,
    /// A byte is on its way (or unread): later completions need not write another.
    signalled: AtomicBool,
    tx: UnixStream,
    rx: UnixStream,
}

impl Shared {
    fn push(&self, done: Done) {
        self.queue.lock().expect("wake queue poisoned").push(done);
        if !self.signalled.swap(true, Ordering::AcqRel) {
            // A full socket buffer already means a wake-up is pending; a closed loop reads nothing.
            let _ = (&self.tx).write(&[1]);
        }
    }
}

/// The reader the loop calls when the socket is readable: resolves every finished operation.
#[pyclass(module = "leaselock._native", name = "_LoopWaker", frozen)]
pub(crate) struct LoopWaker {
    shared: Arc<Shared>,
}

#[pymethods]
impl LoopWaker {
    fn __call__(&self, py: Python<'_>) -> PyResult<()> {
        let mut buf = [0u8; 64];
        loop {
            match (&self.shared.rx).read(&mut buf) {
                Ok(n) if n == buf.len() => continue,
                Ok(_) => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        // Cleared before the queue is taken: anything pushed after the take writes a new byte.
        self.shared.signalled.store(false, Ordering::Release);
        let done = std::mem::take(&mut *self.shared.queue.lock().expect("wake queue poisoned"));
        for Done { fut, finish } in done {
            let fut = fut.bind(py);
            let resolved = (|| -> PyResult<()> {
                // Cancelled meanwhile: the operation ran to its end, nobody awaits its outcome.
                if fut.call_method0(intern!(py, "done"))?.is_truthy()? {
                    return Ok(());
                }
                match finish(py) {
                    Ok(value) => fut.call_method1(intern!(py, "set_result"), (value,))?,
                    Err(e) => fut.call_method1(intern!(py, "set_exception"), (e.into_value(py),))?,
                };
                Ok(())
            })();
            // One future that cannot be resolved must not strand the others.
            if let Err(e) = resolved {
                e.write_unraisable(py, Some(fut));
            }
        }
        Ok(())
    }
}

/// The last loop seen (a weak reference, so a new loop at a freed loop's address never
/// matches) and its waker: the common case of one loop costs a pointer comparison.
struct Last {
    event_loop: Py<PyWeakrefReference>,
    shared: Arc<Shared>,
}

static LAST: Mutex<Option<Last>> = Mutex::new(None);
/// Every loop's waker, dropped with its loop (`weakref.WeakKeyDictionary`).
static WAKERS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn waker_for(event_loop: &Bound<'_, PyAny>) -> PyResult<Arc<Shared>> {
    let py = event_loop.py();
    {
        let last = LAST.lock().expect("wake cache poisoned");
        if let Some(last) = last.as_ref() {
            if last.event_loop.bind(py).upgrade().is_some_and(|l| l.is(event_loop)) {
                return Ok(last.shared.clone());
            }
        }
    }
    let wakers = WAKERS.get_or_try_init(py, || -> PyResult<Py<PyAny>> {
        Ok(py.import("weakref")?.getattr("WeakKeyDictionary")?.call0()?.unbind())
    })?;
    let wakers = wakers.bind(py);
    let shared = match wakers.get_item(event_loop) {
        Ok(waker) => waker.cast::<LoopWaker>()?.get().shared.clone(),
        Err(_) => {
            let (tx, rx) = UnixStream::pair().map_err(|e| errors::to_py(py, leaselock::Error::Store(e.to_string())))?;
            for s in [&tx, &rx] {
                s.set_nonblocking(true).map_err(|e| errors::to_py(py, leaselock::Error::Store(e.to_string())))?;
            }
            let fd = rx.as_raw_fd();
            let shared = Arc::new(Shared { queue: Mutex::default(), signalled: AtomicBool::new(false), tx, rx });
            let waker = Bound::new(py, LoopWaker { shared: shared.clone() })?;
            event_loop.call_method1(intern!(py, "add_reader"), (fd, &waker))?;
            wakers.set_item(event_loop, waker)?;
            shared
        }
    };
    let weak = PyWeakrefReference::new(event_loop)?.unbind();
    *LAST.lock().expect("wake cache poisoned") = Some(Last { event_loop: weak, shared: shared.clone() });
    Ok(shared)
}

/// The awaitable form of `fut`: an asyncio future of the running loop, resolved on that loop
/// once the tokio task running `fut` has finished. The operation runs to its end even if the
/// awaiting task is cancelled: a lease write is never abandoned half-sent.
pub(crate) fn awaitable<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: std::future::Future<Output = leaselock::Result<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let event_loop = pyo3_async_runtimes::get_running_loop(py)?;
    let shared = waker_for(&event_loop)?;
    let py_fut = event_loop.call_method0(intern!(py, "create_future"))?;
    let fut_ref = py_fut.clone().unbind();
    crate::runtime().spawn(async move {
        // The last-resort guard: a panic resolves the future with an `InternalError`.
        let result = std::panic::AssertUnwindSafe(fut).catch_unwind().await;
        let finish: Finish = Box::new(move |py| match result {
            Ok(Ok(v)) => v.into_py_any(py),
            Ok(Err(e)) => Err(errors::to_py(py, e)),
            Err(panic) => Err(errors::panicked(panic)),
        });
        shared.push(Done { fut: fut_ref, finish });
    });
    Ok(py_fut)
}
