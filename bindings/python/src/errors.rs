//! The Python exception tree (`leaselock.LeaseLockError` at the root), mapped from
//! `leaselock::Error` by one match without a catch-all arm: a new core variant must be mapped here.

use leaselock::Error;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::IntoPyObjectExt;

create_exception!(leaselock, LeaseLockError, PyException, "Root of every leaselock error.");
create_exception!(
    leaselock,
    LeaseHeld,
    LeaseLockError,
    "Someone else holds an unexpired lease (`.owner`, `.expires_at_ms`)."
);
create_exception!(
    leaselock,
    LeaseLost,
    LeaseLockError,
    "The lease is no longer ours: taken over, released or past the local deadline."
);
create_exception!(leaselock, LeaseNotFound, LeaseLockError, "The id has no item.");
create_exception!(leaselock, LeaseStopped, LeaseLockError, "The work's desired state is STOPPED.");
create_exception!(leaselock, SeqNotIncreasing, LeaseLockError, "A checkpoint must move forward (`.last_seq`, `.seq`).");
create_exception!(leaselock, Throttled, LeaseLockError, "The store kept throttling until the retry budget ran out.");
create_exception!(
    leaselock,
    InvalidInput,
    LeaseLockError,
    "Bad input, refused before anything was written (`.field`)."
);
create_exception!(leaselock, StoreError, LeaseLockError, "Any other store failure.");
create_exception!(
    leaselock,
    InternalError,
    LeaseLockError,
    "A bug in leaselock: a panic stopped at the binding's edge instead of crossing into Python."
);
create_exception!(leaselock, Timeout, StoreError, "The store did not answer in time (`.outcome_unknown`).");
create_exception!(leaselock, Unreachable, StoreError, "The store could not be reached.");
create_exception!(leaselock, AccessDenied, StoreError, "The credentials may not do this.");
create_exception!(leaselock, TableNotFound, StoreError, "The table does not exist (`.table`).");
create_exception!(
    leaselock,
    NotConfigured,
    StoreError,
    "The AWS client cannot send anything: no credentials or no region (the message names which)."
);

/// `err` with attributes set on its value.
fn with_attrs(py: Python<'_>, err: PyErr, attrs: &[(&str, Py<PyAny>)]) -> PyErr {
    let value = err.value(py);
    for (name, v) in attrs {
        // Setting an attribute on a fresh exception instance cannot fail.
        let _ = value.setattr(*name, v);
    }
    err
}

fn obj<'py, T: IntoPyObject<'py>>(py: Python<'py>, v: T) -> Py<PyAny> {
    v.into_py_any(py).unwrap_or_else(|_| py.None())
}

/// `message` on one line and bounded: core's [`leaselock::render::message`], as Node's are.
fn clean(message: &str) -> String {
    leaselock::render::message(message).into_owned()
}

/// The Python exception for a core error.
pub fn to_py(py: Python<'_>, err: Error) -> PyErr {
    let message = clean(&err.to_string());
    match err {
        Error::Held { owner, expires_at_ms } => with_attrs(
            py,
            LeaseHeld::new_err(message),
            &[("owner", obj(py, owner)), ("expires_at_ms", obj(py, expires_at_ms))],
        ),
        Error::Lost { id } => with_attrs(py, LeaseLost::new_err(message), &[("id", obj(py, id))]),
        Error::NotFound { id } => with_attrs(py, LeaseNotFound::new_err(message), &[("id", obj(py, id))]),
        Error::Stopped { id } => with_attrs(py, LeaseStopped::new_err(message), &[("id", obj(py, id))]),
        Error::SeqNotIncreasing { id, last_seq, seq } => with_attrs(
            py,
            SeqNotIncreasing::new_err(message),
            &[("id", obj(py, id)), ("last_seq", obj(py, last_seq)), ("seq", obj(py, seq))],
        ),
        Error::Throttled => Throttled::new_err(message),
        Error::InvalidInput { field, .. } => invalid(py, &field, &message),
        Error::Timeout { outcome_unknown } => {
            with_attrs(py, Timeout::new_err(message), &[("outcome_unknown", obj(py, outcome_unknown))])
        }
        Error::Unreachable(_) => Unreachable::new_err(message),
        Error::AccessDenied(_) => AccessDenied::new_err(message),
        Error::NotConfigured(_) => NotConfigured::new_err(message),
        Error::TableNotFound { table } => with_attrs(py, TableNotFound::new_err(message), &[("table", obj(py, table))]),
        // A server-side script refused (Redis): a store failure like any other.
        Error::Script(_) | Error::Store(_) => StoreError::new_err(message),
    }
}

/// An `InvalidInput` naming `field` (for the arguments only the binding sees).
pub fn invalid(py: Python<'_>, field: &str, message: &str) -> PyErr {
    let field = leaselock::render::one_line(field);
    with_attrs(py, InvalidInput::new_err(clean(message)), &[("field", obj(py, field.as_ref()))])
}

/// The Python exception for a core error, an `InvalidInput`'s field renamed from core's name
/// to the argument the caller passed (`("hint_wait", "hint_wait_ms")`).
pub fn to_py_named(py: Python<'_>, err: Error, names: &[(&str, &str)]) -> PyErr {
    match err {
        Error::InvalidInput { field, message } => {
            let field = names.iter().find(|(core, _)| *core == field).map_or(field.as_str(), |(_, py)| *py);
            invalid(py, field, &format!("invalid {field}: {message}"))
        }
        e => to_py(py, e),
    }
}

/// The last-resort guard: a panic caught at the binding's edge, as an `InternalError`.
pub fn panicked(payload: Box<dyn std::any::Any + Send>) -> PyErr {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into());
    InternalError::new_err(clean(&format!("internal error (a bug in leaselock): {}", leaselock::render::text(&what))))
}

/// A failure of the binding's own machinery (a task cancelled with the runtime) as a store error.
pub fn machinery(message: String) -> PyErr {
    StoreError::new_err(clean(&message))
}

/// Runs `f`, turning a panic into an `InternalError` instead of letting it cross into Python.
pub fn guarded<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| Err(panicked(p)))
}

/// Adds the exception classes to the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("LeaseLockError", py.get_type::<LeaseLockError>())?;
    m.add("LeaseHeld", py.get_type::<LeaseHeld>())?;
    m.add("LeaseLost", py.get_type::<LeaseLost>())?;
    m.add("LeaseNotFound", py.get_type::<LeaseNotFound>())?;
    m.add("LeaseStopped", py.get_type::<LeaseStopped>())?;
    m.add("SeqNotIncreasing", py.get_type::<SeqNotIncreasing>())?;
    m.add("Throttled", py.get_type::<Throttled>())?;
    m.add("InvalidInput", py.get_type::<InvalidInput>())?;
    m.add("StoreError", py.get_type::<StoreError>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    m.add("Timeout", py.get_type::<Timeout>())?;
    m.add("Unreachable", py.get_type::<Unreachable>())?;
    m.add("AccessDenied", py.get_type::<AccessDenied>())?;
    m.add("TableNotFound", py.get_type::<TableNotFound>())?;
    m.add("NotConfigured", py.get_type::<NotConfigured>())?;
    Ok(())
}
