//! `tempering._core`: thin PyO3 bindings over `tempering-core`.
//!
//! This crate only converts types and errors and releases the GIL around the compute.
//! Every entry point extracts its inputs first (borrowing numpy buffers without copying),
//! runs the compute inside `py.detach` and `catch_unwind`, and maps errors:
//! bad input -> `DataError(ValueError)`, a Rust panic -> `InternalError(RuntimeError)`.

use std::panic::{catch_unwind, AssertUnwindSafe};

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use tempering_core::advantages::{self, AdvantageOptions, Baseline};

create_exception!(
    tempering._core,
    DataError,
    PyValueError,
    "Bad input to the tempering data core; the message names the problem, member and position."
);
create_exception!(
    tempering._core,
    InternalError,
    PyRuntimeError,
    "A bug inside the tempering data core (a Rust panic). Please report it with the input that caused it."
);

fn data_err(e: tempering_core::DataError) -> PyErr {
    DataError::new_err(e.to_string())
}

/// Run `f` with the GIL released; a panic becomes `InternalError`, never a crash.
fn compute<T: Send>(py: Python<'_>, f: impl FnOnce() -> Result<T, tempering_core::DataError> + Send) -> PyResult<T> {
    py.detach(|| catch_unwind(AssertUnwindSafe(f)))
        .map_err(|payload| {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            InternalError::new_err(format!("internal error in tempering._core: {msg}"))
        })?
        .map_err(data_err)
}

/// Borrow a 1-D numpy array as a contiguous slice, or say precisely why not.
fn contiguous<'a, T: numpy::Element>(arr: &'a PyReadonlyArray1<'_, T>, name: &str) -> PyResult<&'a [T]> {
    arr.as_slice()
        .map_err(|_| DataError::new_err(format!("{name} must be a C-contiguous 1-D array; pass np.ascontiguousarray({name})")))
}

fn offsets_to_usize(offsets: &[i64], name: &str) -> PyResult<Vec<usize>> {
    offsets
        .iter()
        .enumerate()
        .map(|(i, &o)| usize::try_from(o).map_err(|_| DataError::new_err(format!("{name}[{i}] is negative ({o})"))))
        .collect()
}

/// Group-relative advantages over ragged groups of rewards.
///
/// `rewards_PG` is flat float64, `offsets_P1` (int64, length P + 1) marks the groups.
#[pyfunction]
#[pyo3(signature = (rewards_PG, offsets_P1, /, *, baseline = "mean", normalize_std = false, eps = 1e-6))]
#[allow(non_snake_case)]
fn group_advantages<'py>(
    py: Python<'py>,
    rewards_PG: PyReadonlyArray1<'py, f64>,
    offsets_P1: PyReadonlyArray1<'py, i64>,
    baseline: &str,
    normalize_std: bool,
    eps: f64,
) -> PyResult<Bound<'py, PyArray1<f64>>> {
    let rewards = contiguous(&rewards_PG, "rewards_PG")?;
    let offsets = offsets_to_usize(contiguous(&offsets_P1, "offsets_P1")?, "offsets_P1")?;
    let opts = AdvantageOptions { baseline: Baseline::parse(baseline).map_err(data_err)?, normalize_std, eps };
    let out = compute(py, || advantages::group_advantages(rewards, &offsets, opts))?;
    Ok(PyArray1::from_vec(py, out))
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("DataError", py.get_type::<DataError>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    m.add_function(wrap_pyfunction!(group_advantages, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
