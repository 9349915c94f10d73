//! `tempering._core`: thin PyO3 bindings over `tempering-core`.
//!
//! This crate only converts types and errors and releases the GIL around the compute.
//! Every entry point extracts its inputs first (borrowing numpy buffers without copying),
//! runs the compute inside `py.detach` and `catch_unwind`, and maps errors:
//! bad input -> `DataError(ValueError)`, a Rust panic -> `InternalError(RuntimeError)`.
//! Outputs are handed to numpy without copying (`PyArray1::from_vec` gives numpy the `Vec`).

#![allow(non_snake_case)] // shape suffixes: tokens_N, offsets_D1 (docs/notation.md)

mod alloc;
mod extract;

use std::panic::{catch_unwind, AssertUnwindSafe};

use numpy::PyArray1;
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyList;

use tempering_core::advantages::{self, AdvantageOptions, Baseline};
use tempering_core::chunks::Floats;
use tempering_core::datums::{self, OpaqueLayout, SegmentSource, TrajectoriesIn, TransitionIn};
use tempering_core::supervised::{self, ExampleIn};
use tempering_core::{kl, Location};

use extract::{attr, flag, float_values, floats, items, located, tokens, FloatOwner, ModelInputs, TokOwner};

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

create_exception!(
    tempering._core,
    DataError,
    PyValueError,
    "Bad input to the tempering data core; the message names the problem, member, transition and token."
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

/// Floats from a float32/float64 array or a sequence of numbers (a copy: these are small).
fn f64_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<f64>> {
    float_values(obj, Location::default(), what)
}

/// Offsets from an int32/int64 array or a sequence of ints; negative values are rejected.
fn offsets_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<usize>> {
    let mut arena = extract::Arena::default();
    let owner = tokens(obj, Location::default(), what, 0, &mut arena)?;
    let v = owner.view(&arena);
    (0..v.len())
        .map(|i| {
            let o = v.get(i);
            usize::try_from(o).map_err(|_| DataError::new_err(format!("{what}[{i}] is negative ({o})")))
        })
        .collect()
}

fn usize_to_i64(v: &[usize]) -> Vec<i64> {
    v.iter().map(|&x| x as i64).collect()
}

/// Group-relative advantages over ragged groups of rewards.
///
/// `rewards_PG` is flat float64, `offsets_P1` (int64, length P + 1) marks the groups.
#[pyfunction]
#[pyo3(signature = (rewards_PG, offsets_P1, /, *, baseline = "mean", normalize_std = false, eps = 1e-6))]
#[allow(non_snake_case)]
fn group_advantages<'py>(
    py: Python<'py>,
    rewards_PG: &Bound<'py, PyAny>,
    offsets_P1: &Bound<'py, PyAny>,
    baseline: &str,
    normalize_std: bool,
    eps: f64,
) -> PyResult<Bound<'py, PyArray1<f64>>> {
    let rewards = f64_arg(rewards_PG, "rewards_PG")?;
    let offsets = offsets_arg(offsets_P1, "offsets_P1")?;
    let opts = AdvantageOptions { baseline: Baseline::parse(baseline).map_err(data_err)?, normalize_std, eps };
    let out = compute(py, || advantages::group_advantages(&rewards, &offsets, opts))?;
    Ok(PyArray1::from_vec(py, out))
}

/// For each group (ragged, like `group_advantages`): are all its rewards equal?
#[pyfunction]
#[pyo3(signature = (rewards_PG, offsets_P1, /))]
#[allow(non_snake_case)]
fn constant_groups<'py>(
    py: Python<'py>,
    rewards_PG: &Bound<'py, PyAny>,
    offsets_P1: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArray1<bool>>> {
    let rewards = f64_arg(rewards_PG, "rewards_PG")?;
    let offsets = offsets_arg(offsets_P1, "offsets_P1")?;
    let out = compute(py, || advantages::constant_groups(&rewards, &offsets))?;
    Ok(PyArray1::from_vec(py, out))
}

/// Check an Arrow-style offsets array over `n_values` values.
#[pyfunction]
#[pyo3(signature = (offsets, n_values, /, *, what = "offsets"))]
fn validate_offsets(py: Python<'_>, offsets: &Bound<'_, PyAny>, n_values: usize, what: &str) -> PyResult<()> {
    let offsets = offsets_arg(offsets, what)?;
    let what = what.to_owned();
    compute(py, || {
        tempering_core::ragged::validate_offsets("offsets", &offsets, n_values)
            .map_err(|e| tempering_core::DataError::InvalidArgument(format!("{what}: {e}")))
    })
}

/// Flat float64 values and their int64 offsets.
type RaggedF64<'py> = (Bound<'py, PyArray1<f64>>, Bound<'py, PyArray1<i64>>);

/// Total reward of every trajectory (step rewards from 0, left to right, plus the final reward),
/// read from `TrajectoryGroup` objects: `(rewards_PG, offsets_P1)`.
#[pyfunction]
#[pyo3(signature = (trajectory_groups_P, /))]
#[allow(non_snake_case)]
fn total_rewards<'py>(py: Python<'py>, trajectory_groups_P: &Bound<'py, PyAny>) -> PyResult<RaggedF64<'py>> {
    let mut steps = Vec::new();
    let mut finals = Vec::new();
    let mut transition_offsets = vec![0usize];
    let mut member_offsets = vec![0usize];
    for (p, group) in items(trajectory_groups_P, Location::default(), "trajectory_groups_P")?.iter().enumerate() {
        let at = Location::problem(p);
        let trajs = items(&attr(group, intern!(py, "trajectories_G"), at)?, at, "trajectories_G")?;
        let fin = float_values(&attr(group, intern!(py, "final_rewards_G"), at)?, at, "final_rewards_G")?;
        if fin.len() != trajs.len() {
            return Err(located(at, format!("{} trajectories but {} final rewards", trajs.len(), fin.len())));
        }
        for (g, traj) in trajs.iter().enumerate() {
            let at = Location::member(p, g);
            for (x, tr) in items(&attr(traj, intern!(py, "transitions"), at)?, at, "transitions")?.iter().enumerate() {
                let at = Location::transition(p, g, x);
                let r = attr(tr, intern!(py, "reward"), at)?;
                steps.push(r.extract::<f64>().map_err(|e| located(at, format!("reward is not a number: {e}")))?);
            }
            transition_offsets.push(steps.len());
            finals.push(fin[g]);
        }
        member_offsets.push(finals.len());
    }
    let out = compute(py, || advantages::total_rewards(&steps, &transition_offsets, &finals, &member_offsets))?;
    Ok((PyArray1::from_vec(py, out), PyArray1::from_vec(py, usize_to_i64(&member_offsets))))
}

/// The packed RL batch, as numpy arrays owned by numpy (no copies).
#[pyclass(frozen, module = "tempering._core", get_all)]
#[allow(non_snake_case)]
struct PackedRL {
    tokens_N: Py<PyArray1<i64>>,
    target_tokens_N: Py<PyArray1<i64>>,
    logprobs_N: Py<PyArray1<f32>>,
    advantages_N: Py<PyArray1<f32>>,
    mask_N: Py<PyArray1<f32>>,
    offsets_D1: Py<PyArray1<i64>>,
    group_idx_D: Py<PyArray1<i64>>,
    traj_idx_D: Py<PyArray1<i64>>,
    opaque_offsets_D1: Py<PyArray1<i64>>,
    opaque_pos_C: Py<PyArray1<i64>>,
    opaque_len_C: Py<PyArray1<i64>>,
    opaque_chunks_C: Py<PyList>,
    /// With `token_runs=True`: for each datum, its model input's token runs (the runs between
    /// its opaque chunks, `K_d + 1` lists of ints), built from the input lists' own int objects.
    token_runs_D: Option<Py<PyList>>,
    compared_positions: usize,
}

/// Where the model inputs' tokens came from, to rebuild them as Python lists.
struct RunSources<'a, 'py> {
    specs: &'a [TransitionSpec],
    inputs: &'a ModelInputs<'py>,
    ac_tokens: &'a [TokOwner<'py>],
    ac_sources: &'a [Bound<'py, PyAny>],
}

impl<'py> RunSources<'_, 'py> {
    /// For each datum, the token runs of its model input (see `PackedRL.token_runs_D`).
    ///
    /// A run taken from a Python list of exact ints is a slice of that list: the int objects are
    /// shared, not created again (one pointer copy per token instead of an allocation). Other
    /// sources (numpy arrays, lists with other items) give new ints from the values read.
    /// The input must not be modified while it is packed (as for numpy arrays, whose memory is
    /// read without the GIL).
    fn token_runs(&self, py: Python<'py>, out: &datums::PackedRl) -> PyResult<Bound<'py, PyList>> {
        let all = PyList::empty(py);
        let extend = intern!(py, "extend");
        for w in out.input_segment_offsets_D1.windows(2) {
            let runs = PyList::empty(py);
            let mut current: Option<Bound<'py, PyList>> = None;
            for seg in &out.input_segments[w[0]..w[1]] {
                let (owner, source) = match seg.source {
                    SegmentSource::Opaque { .. } => {
                        runs.append(current.take().unwrap_or_else(|| PyList::empty(py)))?;
                        continue;
                    }
                    SegmentSource::Observation { chunk } => {
                        let spec = &self.inputs.chunks[self.specs[seg.transition].ob.start + chunk];
                        let extract::ChunkSpec::Tokens(i) = *spec else {
                            return Err(InternalError::new_err(
                                "internal error: a token segment names an opaque chunk",
                            ));
                        };
                        (&self.inputs.tokens[i], &self.inputs.token_sources[i])
                    }
                    SegmentSource::Action => {
                        let a = self.specs[seg.transition].ac;
                        (&self.ac_tokens[a], &self.ac_sources[a])
                    }
                };
                let part = match source.cast::<PyList>() {
                    Ok(list) if owner.exact_list() => list.get_slice(seg.start, seg.start + seg.len),
                    _ => {
                        let v = owner.view(&self.inputs.arena);
                        PyList::new(py, (seg.start..seg.start + seg.len).map(|i| v.get(i)))?
                    }
                };
                match &current {
                    None => current = Some(part),
                    Some(c) => {
                        c.call_method1(extend, (part,))?;
                    }
                }
            }
            runs.append(current.take().unwrap_or_else(|| PyList::empty(py)))?;
            all.append(runs)?;
        }
        Ok(all)
    }
}

/// The packed supervised batch, as numpy arrays owned by numpy (no copies).
#[pyclass(frozen, module = "tempering._core", get_all)]
#[allow(non_snake_case)]
struct PackedSupervised {
    tokens_N: Py<PyArray1<i64>>,
    target_tokens_N: Py<PyArray1<i64>>,
    weights_N: Py<PyArray1<f32>>,
    offsets_D1: Py<PyArray1<i64>>,
    opaque_offsets_D1: Py<PyArray1<i64>>,
    opaque_pos_C: Py<PyArray1<i64>>,
    opaque_len_C: Py<PyArray1<i64>>,
    opaque_chunks_C: Py<PyList>,
}

type OpaqueArrays = (Py<PyArray1<i64>>, Py<PyArray1<i64>>, Py<PyArray1<i64>>, Py<PyList>);

/// The metrics keys that mask a turn (`tempering_protocols.MASK_TURN` and the Tinker Cookbook's
/// `PARSE_ERROR_MASKED`): a transition built by user code, or read from a Cookbook log, that
/// carries one of them set is masked as if its `masked` field were true.
const MASKING_METRICS: [&str; 2] = ["turn/masked", "parse_error_masked"];

/// Whether `tr.metrics` (any mapping with `.get`; absent or `None` is no metrics) sets a masking key.
fn masked_by_metrics(tr: &Bound<'_, PyAny>, at: Location) -> PyResult<bool> {
    let py = tr.py();
    let metrics = match tr.getattr_opt(intern!(py, "metrics")) {
        Ok(Some(m)) if !m.is_none() => m,
        Ok(_) => return Ok(false),
        Err(e) => return Err(extract::wrap(at, ".metrics", e)),
    };
    for key in MASKING_METRICS {
        let value = metrics
            .call_method1(intern!(py, "get"), (key,))
            .map_err(|e| extract::wrap(at, &format!(".metrics[{key:?}]"), e))?;
        if !value.is_none() && value.is_truthy().map_err(|e| extract::wrap(at, &format!(".metrics[{key:?}]"), e))? {
            return Ok(true);
        }
    }
    Ok(false)
}

fn opaque_to_py<'py>(py: Python<'py>, o: OpaqueLayout, objects: &[Bound<'py, PyAny>]) -> PyResult<OpaqueArrays> {
    let chunks = PyList::new(py, o.handle_C.iter().map(|&h| &objects[h as usize]))?;
    Ok((
        PyArray1::from_vec(py, o.offsets_D1).unbind(),
        PyArray1::from_vec(py, o.pos_C).unbind(),
        PyArray1::from_vec(py, o.len_C).unbind(),
        chunks.unbind(),
    ))
}

/// One transition, read but not yet viewed.
struct TransitionSpec {
    ob: std::ops::Range<usize>,
    ac: usize,
    logprobs: usize,
    masked: bool,
}

/// Trajectories → datums, into one columnar batch (see `tempering_core::datums`).
#[pyfunction]
#[pyo3(signature = (trajectory_groups_P, advantages_P, /, *, token_runs = false))]
#[allow(non_snake_case)]
fn pack_trajectories<'py>(
    py: Python<'py>,
    trajectory_groups_P: &Bound<'py, PyAny>,
    advantages_P: &Bound<'py, PyAny>,
    token_runs: bool,
) -> PyResult<PackedRL> {
    let groups = items(trajectory_groups_P, Location::default(), "trajectory_groups_P")?;
    let advs = items(advantages_P, Location::default(), "advantages_P")?;
    if groups.len() != advs.len() {
        return Err(located(
            Location::default(),
            format!(
                "{} trajectory groups but {} advantage arrays (advantages_P needs one per group)",
                groups.len(),
                advs.len()
            ),
        ));
    }
    let mut inputs = ModelInputs::default();
    let mut ac_tokens: Vec<TokOwner<'py>> = Vec::new();
    let mut ac_sources: Vec<Bound<'py, PyAny>> = Vec::new();
    let mut ac_logprobs: Vec<FloatOwner<'py>> = Vec::new();
    let mut specs: Vec<TransitionSpec> = Vec::new();
    let mut transition_offsets = vec![0usize];
    let mut member_offsets = vec![0usize];
    let mut advantages_pg: Vec<f64> = Vec::new();
    for (p, (group, adv)) in groups.iter().zip(&advs).enumerate() {
        let at = Location::problem(p);
        let trajs = items(&attr(group, intern!(py, "trajectories_G"), at)?, at, "trajectories_G")?;
        let adv = float_values(adv, at, &format!("advantages_P[{p}]"))?;
        if adv.len() != trajs.len() {
            return Err(located(
                at,
                format!(
                    "the group has {} trajectories but advantages_P[{p}] has {} advantages",
                    trajs.len(),
                    adv.len()
                ),
            ));
        }
        for (g, traj) in trajs.iter().enumerate() {
            let at = Location::member(p, g);
            advantages_pg.push(adv[g]);
            for (x, tr) in items(&attr(traj, intern!(py, "transitions"), at)?, at, "transitions")?.iter().enumerate() {
                let at = Location::transition(p, g, x);
                let ob = inputs.read(&attr(tr, intern!(py, "ob"), at)?, at, "ob")?;
                let ac = attr(tr, intern!(py, "ac"), at)?;
                let ac_source = attr(&ac, intern!(py, "tokens"), at)?;
                let toks = tokens(&ac_source, at, "ac.tokens", 0, &mut inputs.arena)?;
                let lp = attr(&ac, intern!(py, "maybe_logprobs"), at)?;
                let lp = if lp.is_none() {
                    if !toks.is_empty() {
                        return Err(located(
                            at,
                            "the action has no logprobs (ac.maybe_logprobs is None); RL training needs the \
                             sampler's logprob of every sampled token",
                        ));
                    }
                    FloatOwner::Arena(extract::Run::EMPTY)
                } else {
                    floats(&lp, at, "ac.maybe_logprobs", &mut inputs.arena.floats)?
                };
                specs.push(TransitionSpec {
                    ob,
                    ac: ac_tokens.len(),
                    logprobs: ac_logprobs.len(),
                    masked: flag(tr, intern!(py, "masked"), false, at)? || masked_by_metrics(tr, at)?,
                });
                ac_tokens.push(toks);
                ac_sources.push(ac_source);
                ac_logprobs.push(lp);
            }
            transition_offsets.push(specs.len());
        }
        member_offsets.push(advantages_pg.len());
    }
    let chunks = inputs.views();
    let transitions: Vec<TransitionIn<'_>> = specs
        .iter()
        .map(|s| TransitionIn {
            ob: &chunks[s.ob.clone()],
            ac_tokens: ac_tokens[s.ac].view(&inputs.arena),
            ac_logprobs: ac_logprobs[s.logprobs].view(&inputs.arena),
            masked: s.masked,
        })
        .collect();
    let input = TrajectoriesIn {
        transitions_X: &transitions,
        transition_offsets_PG1: &transition_offsets,
        member_offsets_P1: &member_offsets,
        advantages_PG: &advantages_pg,
    };
    let out = compute(py, || datums::pack_trajectories(&input))?;
    let token_runs_D = if token_runs {
        let sources = RunSources { specs: &specs, inputs: &inputs, ac_tokens: &ac_tokens, ac_sources: &ac_sources };
        Some(sources.token_runs(py, &out)?.unbind())
    } else {
        None
    };
    let (opaque_offsets_D1, opaque_pos_C, opaque_len_C, opaque_chunks_C) =
        opaque_to_py(py, out.opaque, &inputs.opaque)?;
    Ok(PackedRL {
        token_runs_D,
        tokens_N: PyArray1::from_vec(py, out.tokens_N).unbind(),
        target_tokens_N: PyArray1::from_vec(py, out.target_tokens_N).unbind(),
        logprobs_N: PyArray1::from_vec(py, out.logprobs_N).unbind(),
        advantages_N: PyArray1::from_vec(py, out.advantages_N).unbind(),
        mask_N: PyArray1::from_vec(py, out.mask_N).unbind(),
        offsets_D1: PyArray1::from_vec(py, out.offsets_D1).unbind(),
        group_idx_D: PyArray1::from_vec(py, out.group_idx_D).unbind(),
        traj_idx_D: PyArray1::from_vec(py, out.traj_idx_D).unbind(),
        opaque_offsets_D1,
        opaque_pos_C,
        opaque_len_C,
        opaque_chunks_C,
        compared_positions: out.compared_positions,
    })
}

/// Supervised datums from model inputs and per-position weights (see `tempering_core::supervised`).
#[pyfunction]
#[pyo3(signature = (model_inputs, weights, /, *, max_length = None))]
fn pack_examples<'py>(
    py: Python<'py>,
    model_inputs: &Bound<'py, PyAny>,
    weights: &Bound<'py, PyAny>,
    max_length: Option<i64>,
) -> PyResult<PackedSupervised> {
    let max_length = max_length
        .map(|m| {
            usize::try_from(m).map_err(|_| {
                DataError::new_err(format!("max_length must be >= 0 (the positions kept per example), got {m}"))
            })
        })
        .transpose()?;
    let mis = items(model_inputs, Location::default(), "model_inputs")?;
    let ws = items(weights, Location::default(), "weights")?;
    if mis.len() != ws.len() {
        return Err(located(Location::default(), format!("{} model inputs but {} weight arrays", mis.len(), ws.len())));
    }
    let mut inputs = ModelInputs::default();
    let mut ranges = Vec::with_capacity(mis.len());
    let mut weight_owners = Vec::with_capacity(mis.len());
    for (i, (mi, w)) in mis.iter().zip(&ws).enumerate() {
        let at = Location::example(i);
        ranges.push(inputs.read(mi, at, "model_input")?);
        weight_owners.push(floats(w, at, "weights", &mut inputs.arena.floats)?);
    }
    let chunks = inputs.views();
    let examples: Vec<ExampleIn<'_>> = ranges
        .iter()
        .zip(&weight_owners)
        .map(|(r, w)| ExampleIn { chunks: &chunks[r.clone()], weights: w.view(&inputs.arena) })
        .collect();
    let out = compute(py, || supervised::pack_examples(&examples, max_length))?;
    let (opaque_offsets_D1, opaque_pos_C, opaque_len_C, opaque_chunks_C) =
        opaque_to_py(py, out.opaque, &inputs.opaque)?;
    Ok(PackedSupervised {
        tokens_N: PyArray1::from_vec(py, out.tokens_N).unbind(),
        target_tokens_N: PyArray1::from_vec(py, out.target_tokens_N).unbind(),
        weights_N: PyArray1::from_vec(py, out.weights_N).unbind(),
        offsets_D1: PyArray1::from_vec(py, out.offsets_D1).unbind(),
        opaque_offsets_D1,
        opaque_pos_C,
        opaque_len_C,
        opaque_chunks_C,
    })
}

/// KL penalty against reference logprobs, folded into new advantages (see `tempering_core::kl`).
/// Returns `(advantages_N, mean_logprob_diff)`; the inputs are not modified.
#[pyfunction]
#[pyo3(signature = (logprobs_N, ref_logprobs_N, mask_N, advantages_N, offsets_D1, /, *, coef, discount = 0.0))]
#[allow(non_snake_case, clippy::too_many_arguments)]
fn kl_penalty<'py>(
    py: Python<'py>,
    logprobs_N: &Bound<'py, PyAny>,
    ref_logprobs_N: &Bound<'py, PyAny>,
    mask_N: &Bound<'py, PyAny>,
    advantages_N: &Bound<'py, PyAny>,
    offsets_D1: &Bound<'py, PyAny>,
    coef: f64,
    discount: f64,
) -> PyResult<(Bound<'py, PyArray1<f32>>, f64)> {
    let at = Location::default();
    let mut arena = extract::Arena::default();
    let owners = [
        floats(logprobs_N, at, "logprobs_N", &mut arena.floats)?,
        floats(ref_logprobs_N, at, "ref_logprobs_N", &mut arena.floats)?,
        floats(mask_N, at, "mask_N", &mut arena.floats)?,
        floats(advantages_N, at, "advantages_N", &mut arena.floats)?,
    ];
    let views: Vec<Floats<'_>> = owners.iter().map(|o| o.view(&arena)).collect();
    let offsets = offsets_arg(offsets_D1, "offsets_D1")?;
    let input = kl::KlIn {
        logprobs_N: views[0],
        ref_logprobs_N: views[1],
        mask_N: views[2],
        advantages_N: views[3],
        offsets_D1: &offsets,
    };
    let out = compute(py, || kl::kl_penalty(&input, coef, discount))?;
    Ok((PyArray1::from_vec(py, out.advantages_N), out.mean_logprob_diff))
}

/// `(current, peak)` bytes held on the extension's Rust heap (for memory benchmarks).
#[cfg(feature = "alloc-stats")]
#[pyfunction]
fn _alloc_stats() -> (usize, usize) {
    alloc::stats()
}

/// Start a new peak-memory measurement from the current level.
#[cfg(feature = "alloc-stats")]
#[pyfunction]
fn _reset_alloc_peak() {
    alloc::reset_peak();
}

/// Return the large freed blocks the extension keeps for reuse to the system; the bytes released.
#[pyfunction]
fn _release_memory() -> usize {
    alloc::release()
}

/// Panic inside `compute` (with the GIL released), to test that panics become `InternalError`.
#[cfg(feature = "test-hooks")]
#[pyfunction]
fn _panic_for_test(py: Python<'_>, message: String) -> PyResult<()> {
    compute(py, move || -> Result<(), tempering_core::DataError> { panic!("{message}") })
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("DataError", py.get_type::<DataError>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    m.add_class::<PackedRL>()?;
    m.add_class::<PackedSupervised>()?;
    m.add_function(wrap_pyfunction!(group_advantages, m)?)?;
    m.add_function(wrap_pyfunction!(constant_groups, m)?)?;
    m.add_function(wrap_pyfunction!(validate_offsets, m)?)?;
    m.add_function(wrap_pyfunction!(total_rewards, m)?)?;
    m.add_function(wrap_pyfunction!(pack_trajectories, m)?)?;
    m.add_function(wrap_pyfunction!(pack_examples, m)?)?;
    m.add_function(wrap_pyfunction!(kl_penalty, m)?)?;
    m.add_function(wrap_pyfunction!(_release_memory, m)?)?;
    #[cfg(feature = "alloc-stats")]
    {
        m.add_function(wrap_pyfunction!(_alloc_stats, m)?)?;
        m.add_function(wrap_pyfunction!(_reset_alloc_peak, m)?)?;
    }
    #[cfg(feature = "test-hooks")]
    m.add_function(wrap_pyfunction!(_panic_for_test, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
