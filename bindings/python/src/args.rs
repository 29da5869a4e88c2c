//! Python values to the Rust types core takes, each failure an `InvalidInput` naming the
//! argument the caller passed (never a `TypeError`, `OverflowError` or `UnicodeEncodeError`).
//! What a value may be (ids, urls, limits) is core's decision; this only converts.

use std::collections::BTreeMap;
use std::time::Duration;

use leaselock::render;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use crate::errors::invalid;

/// The type name of `obj`, quoted as a value (a class name is the caller's text too).
fn type_of(obj: &Bound<'_, PyAny>) -> String {
    let name = obj.get_type().name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|_| "?".into());
    render::value(&name)
}

fn refused(py: Python<'_>, field: &str, detail: &str) -> PyErr {
    invalid(py, field, &format!("invalid {field}: {detail}"))
}

/// A `str` as UTF-8; a lone surrogate is refused, never replaced.
pub fn text(py: Python<'_>, field: &str, obj: &Bound<'_, PyAny>) -> PyResult<String> {
    let Ok(s) = obj.cast::<PyString>() else {
        return Err(refused(py, field, &format!("must be a str, not {}", type_of(obj))));
    };
    match s.to_cow() {
        Ok(s) => Ok(s.into_owned()),
        Err(_) => {
            // Shown with the surrogate as `\u{d800}`, never replaced by U+FFFD.
            let head: Vec<u16> = s
                .as_any()
                .get_item(pyo3::types::PySlice::new(py, 0, 200, 1))
                .and_then(|head| head.call_method1("encode", ("utf-16-le", "surrogatepass")))
                .and_then(|b| b.extract::<Vec<u8>>())
                .map(|b| b.chunks_exact(2).map(|u| u16::from_le_bytes([u[0], u[1]])).collect())
                .unwrap_or_default();
            let total = s.call_method1("encode", ("utf-8", "surrogatepass")).and_then(|b| b.len()).unwrap_or(0);
            let shown = render::utf16_value(&head, total);
            Err(refused(py, field, &format!("{shown} holds a lone surrogate: not valid Unicode")))
        }
    }
}

/// A whole number (not a `bool`, not a `float`), as an `i128`; larger ones are refused.
pub fn int(py: Python<'_>, field: &str, obj: &Bound<'_, PyAny>) -> PyResult<i128> {
    if obj.is_instance_of::<PyBool>() || !obj.is_instance_of::<PyInt>() {
        return Err(refused(py, field, &format!("must be an int, not {}", type_of(obj))));
    }
    obj.extract::<i128>().map_err(|_| {
        let repr = obj.repr().map(|r| r.to_string_lossy().into_owned()).unwrap_or_default();
        refused(py, field, &format!("{} is out of range", render::value(&repr)))
    })
}

/// A whole number from 0 up to the target type's largest value (core checks the real limit).
pub fn count<T: TryFrom<i128>>(py: Python<'_>, field: &str, obj: &Bound<'_, PyAny>) -> PyResult<T> {
    let v = int(py, field, obj)?;
    if v < 0 {
        return Err(refused(py, field, &format!("{v} must not be negative")));
    }
    T::try_from(v).map_err(|_| refused(py, field, &format!("{v} is out of range")))
}

/// A real number (an `int` or a `float`; not a `bool`).
pub fn number(py: Python<'_>, field: &str, obj: &Bound<'_, PyAny>) -> PyResult<f64> {
    if obj.is_instance_of::<PyBool>() || !(obj.is_instance_of::<PyInt>() || obj.is_instance_of::<PyFloat>()) {
        return Err(refused(py, field, &format!("must be a number, not {}", type_of(obj))));
    }
    obj.extract::<f64>().map_err(|_| refused(py, field, "is out of range"))
}

/// A `bool`.
pub fn flag(py: Python<'_>, field: &str, obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    obj.cast::<PyBool>()
        .map(|b| b.is_true())
        .map_err(|_| refused(py, field, &format!("must be a bool, not {}", type_of(obj))))
}

/// A `dict` of `str` to `str` (`None` is empty).
pub fn text_map(py: Python<'_>, field: &str, obj: Option<&Bound<'_, PyAny>>) -> PyResult<BTreeMap<String, String>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else { return Ok(BTreeMap::new()) };
    let Ok(dict) = obj.cast::<PyDict>() else {
        return Err(refused(py, field, &format!("must be a dict, not {}", type_of(obj))));
    };
    let mut out = BTreeMap::new();
    for (k, v) in dict.iter() {
        out.insert(text(py, field, &k)?, text(py, field, &v)?);
    }
    Ok(out)
}

/// A list or tuple of `str`.
pub fn text_list(py: Python<'_>, field: &str, obj: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    let items: Vec<Bound<'_, PyAny>> = if let Ok(l) = obj.cast::<PyList>() {
        l.iter().collect()
    } else if let Ok(t) = obj.cast::<PyTuple>() {
        t.iter().collect()
    } else {
        return Err(refused(py, field, &format!("must be a list of str, not {}", type_of(obj))));
    };
    items.iter().map(|i| text(py, field, i)).collect()
}

/// An argument as the caller passed it, or its default: taken as any object, so every
/// conversion failure is an `InvalidInput` naming the argument (see the functions above).
pub enum Arg {
    Given(Py<PyAny>),
    Int(u64),
    Text(&'static str),
    Bool(bool),
    Absent,
}

impl<'a, 'py> FromPyObject<'a, 'py> for Arg {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(Arg::Given(obj.to_owned().unbind()))
    }
}

impl Arg {
    /// The object passed, `None` when absent or Python's `None`.
    fn given<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyAny>> {
        match self {
            Arg::Given(o) if !o.is_none(py) => Some(o.bind(py).clone()),
            _ => None,
        }
    }

    /// Whether the caller passed the argument at all (`None` included): one left out keeps
    /// the default the caller fills in.
    pub fn passed(&self) -> bool {
        !matches!(self, Arg::Absent)
    }

    fn default_missing(py: Python<'_>, field: &str) -> PyErr {
        refused(py, field, "is required")
    }

    pub fn text(&self, py: Python<'_>, field: &str) -> PyResult<String> {
        match (self, self.given(py)) {
            (_, Some(o)) => text(py, field, &o),
            (Arg::Text(s), None) => Ok((*s).to_string()),
            (Arg::Given(o), None) => text(py, field, o.bind(py)),
            _ => Err(Self::default_missing(py, field)),
        }
    }

    pub fn opt_text(&self, py: Python<'_>, field: &str) -> PyResult<Option<String>> {
        match (self, self.given(py)) {
            (_, Some(o)) => text(py, field, &o).map(Some),
            (Arg::Text(s), None) => Ok(Some((*s).to_string())),
            _ => Ok(None),
        }
    }

    pub fn count<T: TryFrom<i128> + TryFrom<u64>>(&self, py: Python<'_>, field: &str) -> PyResult<T> {
        match (self, self.given(py)) {
            (_, Some(o)) => count(py, field, &o),
            (Arg::Int(v), None) => T::try_from(*v).map_err(|_| refused(py, field, "is out of range")),
            (Arg::Given(o), None) => count(py, field, o.bind(py)),
            _ => Err(Self::default_missing(py, field)),
        }
    }

    pub fn opt_count<T: TryFrom<i128> + TryFrom<u64>>(&self, py: Python<'_>, field: &str) -> PyResult<Option<T>> {
        match (self, self.given(py)) {
            (_, Some(o)) => count(py, field, &o).map(Some),
            (Arg::Int(_), None) => self.count(py, field).map(Some),
            _ => Ok(None),
        }
    }

    pub fn ms(&self, py: Python<'_>, field: &str) -> PyResult<Duration> {
        self.count::<u64>(py, field).map(Duration::from_millis)
    }

    pub fn opt_ms(&self, py: Python<'_>, field: &str) -> PyResult<Option<Duration>> {
        Ok(self.opt_count::<u64>(py, field)?.map(Duration::from_millis))
    }

    pub fn flag(&self, py: Python<'_>, field: &str) -> PyResult<bool> {
        match (self, self.given(py)) {
            (_, Some(o)) => flag(py, field, &o),
            (Arg::Bool(b), None) => Ok(*b),
            (Arg::Given(o), None) => flag(py, field, o.bind(py)),
            _ => Err(Self::default_missing(py, field)),
        }
    }

    pub fn number(&self, py: Python<'_>, field: &str) -> PyResult<f64> {
        match (self, self.given(py)) {
            (_, Some(o)) => number(py, field, &o),
            (Arg::Int(v), None) => Ok(*v as f64),
            (Arg::Given(o), None) => number(py, field, o.bind(py)),
            _ => Err(Self::default_missing(py, field)),
        }
    }

    pub fn text_map(&self, py: Python<'_>, field: &str) -> PyResult<BTreeMap<String, String>> {
        text_map(py, field, self.given(py).as_ref())
    }

    pub fn text_list(&self, py: Python<'_>, field: &str) -> PyResult<Vec<String>> {
        match self.given(py) {
            Some(o) => text_list(py, field, &o),
            None => Err(Self::default_missing(py, field)),
        }
    }
}
