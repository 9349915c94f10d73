//! Reading Python inputs (with the GIL held) into borrowed views for the core.
//!
//! numpy arrays are borrowed in place (read-only borrow, no copy); Python lists, tuples and other
//! sequences of ints / floats are read into a few large blocks ([`Arena`]), exact `int` and
//! `float` items through a fast path that neither counts references nor runs Python code. A
//! model-input object met several times (a group's shared prompt) is read once. Anything
//! malformed becomes a `DataError` that says where it is (problem, member, transition, token)
//! and what was expected.

use numpy::prelude::*;
use numpy::{PyArray1, PyReadonlyArray1, PyUntypedArray};
use std::collections::HashMap;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyTuple, PyType};
use pyo3::{ffi, intern};

use tempering_core::chunks::{Chunk, Floats, Tokens};
use tempering_core::{DataError as CoreError, Location};

use crate::data_err;

/// A located error, as a Python `DataError`.
pub fn located(at: Location, what: impl Into<String>) -> PyErr {
    data_err(CoreError::at(at, what))
}

/// Wrap an error raised by Python code while reading a located value.
pub fn wrap(at: Location, what: &str, err: PyErr) -> PyErr {
    let e = located(at, format!("{what}: {err}"));
    Python::attach(|py| e.set_cause(py, Some(err)));
    e
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map_or_else(|_| "?".to_owned(), |n| n.to_string())
}

/// Values read from Python lists and tuples, in blocks that are never moved: a run of values
/// lives in one block. Blocks grow to 2 MiB (then come from huge pages, see `alloc`), so
/// reading a large batch costs a few allocations and page faults rather than one per list.
pub struct Blocks<T> {
    blocks: Vec<Vec<T>>,
}

impl<T> Default for Blocks<T> {
    fn default() -> Self {
        Self { blocks: Vec::new() }
    }
}

/// A run of values in [`Blocks`].
#[derive(Clone, Debug)]
pub struct Run {
    block: usize,
    start: usize,
    end: usize,
    /// Read from a list whose every item is an exact `int` / `float` (so the list's items can
    /// stand for the values).
    exact_list: bool,
}

impl Run {
    pub const EMPTY: Run = Run { block: usize::MAX, start: 0, end: 0, exact_list: false };
}

impl<T: Copy> Blocks<T> {
    const MAX_BYTES: usize = 2 << 20;
    const MIN_BYTES: usize = 16 << 10;

    /// The block to append a run of `n` values to (with room for all of them).
    fn room(&mut self, n: usize) -> &mut Vec<T> {
        let size = std::mem::size_of::<T>().max(1);
        let fits = self.blocks.last().is_some_and(|b| b.capacity() - b.len() >= n);
        if !fits {
            let prev = self.blocks.last().map_or(0, Vec::capacity) * size;
            let bytes = (2 * prev).clamp(Self::MIN_BYTES, Self::MAX_BYTES);
            self.blocks.push(Vec::with_capacity(n.max(bytes / size)));
        }
        let last = self.blocks.len() - 1;
        &mut self.blocks[last]
    }

    fn last_index(&self) -> usize {
        self.blocks.len() - 1
    }

    pub fn get(&self, r: &Run) -> &[T] {
        if r.block == usize::MAX {
            return &[];
        }
        &self.blocks[r.block][r.start..r.end]
    }
}

/// What the extraction reads from lists: token ids (as `i32` when a whole list fits, which
/// halves the memory; otherwise `i64`) and floats (`f64`, exactly as Python holds them).
#[derive(Default)]
pub struct Arena {
    pub ints32: Blocks<i32>,
    pub ints: Blocks<i64>,
    pub floats: Blocks<f64>,
}

/// Tokens, held as the caller gave them (numpy, borrowed) or read into the arena.
pub enum TokOwner<'py> {
    I32(PyReadonlyArray1<'py, i32>),
    I64(PyReadonlyArray1<'py, i64>),
    Arena32(Run),
    Arena(Run),
}

impl TokOwner<'_> {
    /// A view of the tokens. Contiguity was checked when the array was read.
    pub fn view<'s>(&'s self, arena: &'s Arena) -> Tokens<'s> {
        match self {
            Self::I32(a) => Tokens::I32(a.as_slice().unwrap_or_default()),
            Self::I64(a) => Tokens::I64(a.as_slice().unwrap_or_default()),
            Self::Arena32(r) => Tokens::I32(arena.ints32.get(r)),
            Self::Arena(r) => Tokens::I64(arena.ints.get(r)),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Self::I32(a) => a.len(),
            Self::I64(a) => a.len(),
            Self::Arena32(r) | Self::Arena(r) => r.end - r.start,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the tokens were read from a Python list of exact ints (whose items can then be
    /// reused as the values).
    pub fn exact_list(&self) -> bool {
        matches!(self, Self::Arena32(r) | Self::Arena(r) if r.exact_list)
    }
}

/// Floats, held as the caller gave them (numpy, borrowed) or read into the arena.
pub enum FloatOwner<'py> {
    F32(PyReadonlyArray1<'py, f32>),
    F64(PyReadonlyArray1<'py, f64>),
    Arena(Run),
}

impl FloatOwner<'_> {
    pub fn view<'s>(&'s self, arena: &'s Arena) -> Floats<'s> {
        match self {
            Self::F32(a) => Floats::F32(a.as_slice().unwrap_or_default()),
            Self::F64(a) => Floats::F64(a.as_slice().unwrap_or_default()),
            Self::Arena(r) => Floats::F64(arena.floats.get(r)),
        }
    }
}

/// Borrow a 1-D numpy array of element type `T`, or explain why not.
fn borrow_array<'py, T: numpy::Element>(
    arr: &Bound<'py, PyUntypedArray>,
    at: Location,
    what: &str,
) -> PyResult<PyReadonlyArray1<'py, T>> {
    let typed = arr.cast::<PyArray1<T>>().map_err(|_| located(at, format!("{what}: unexpected array type")))?;
    let ro = typed
        .try_readonly()
        .map_err(|e| located(at, format!("{what}: the array cannot be borrowed for reading ({e})")))?;
    if ro.as_slice().is_err() {
        return Err(located(
            at,
            format!("{what} must be a C-contiguous 1-D array (got a strided view); pass np.ascontiguousarray(...)"),
        ));
    }
    Ok(ro)
}

/// Check a numpy array is 1-D.
fn one_d(arr: &Bound<'_, PyUntypedArray>, at: Location, what: &str) -> PyResult<()> {
    if arr.ndim() != 1 {
        return Err(located(at, format!("{what} must be a 1-D array, got {} dimensions", arr.ndim())));
    }
    Ok(())
}

/// The name of a numpy array's dtype (only for error messages: numpy computes it in Python).
fn dtype_name(arr: &Bound<'_, PyUntypedArray>) -> String {
    arr.dtype().str().map_or_else(|_| "?".to_owned(), |s| s.to_string())
}

fn is_dtype<T: numpy::Element>(arr: &Bound<'_, PyUntypedArray>) -> bool {
    arr.dtype().is_equiv_to(&numpy::dtype::<T>(arr.py()))
}

/// Read every item of a list: `fast` converts exact ints / floats straight from the borrowed item
/// pointer (no reference counting, no Python code); anything else goes through pyo3's
/// extraction. On failure: the index, the item and the error.
type ItemError<'py> = (usize, Bound<'py, PyAny>, PyErr);

fn list_values<'py, T: Copy>(
    list: &Bound<'py, PyList>,
    blocks: &mut Blocks<T>,
    fast: impl Fn(*mut ffi::PyObject) -> Option<T>,
    slow: impl Fn(&Bound<'py, PyAny>) -> PyResult<T>,
) -> Result<Run, ItemError<'py>> {
    let py = list.py();
    let n = list.len();
    let v = blocks.room(n);
    let start = v.len();
    let mut exact_list = true;
    for i in 0..n {
        // SAFETY: `PyList_GetItem` checks the index (the list may shrink if a slow-path
        // conversion runs Python code) and returns a borrowed reference or NULL with an error set.
        let item = unsafe { ffi::PyList_GetItem(list.as_ptr(), i as ffi::Py_ssize_t) };
        if item.is_null() {
            let err = PyErr::fetch(py);
            v.truncate(start);
            return Err((i, py.None().into_bound(py), err));
        }
        if let Some(x) = fast(item) {
            v.push(x);
            continue;
        }
        exact_list = false;
        // SAFETY: `item` is a valid borrowed reference; `from_borrowed_ptr` takes a new one.
        let item = unsafe { Bound::from_borrowed_ptr(py, item) };
        match slow(&item) {
            Ok(x) => v.push(x),
            Err(e) => {
                v.truncate(start);
                return Err((i, item, e));
            }
        }
    }
    // A list that grew while slow-path conversions ran Python code may have overflowed the
    // block's reserved room: then the block moved, which is fine, nothing points into it yet.
    let end = v.len();
    exact_list &= end - start == n;
    Ok(Run { block: blocks.last_index(), start, end, exact_list })
}

/// Read every item of any other iterable with `extract`.
fn iter_values<'py, T: Copy>(
    obj: &Bound<'py, PyAny>,
    blocks: &mut Blocks<T>,
    extract: impl Fn(&Bound<'py, PyAny>) -> PyResult<T>,
) -> Result<Run, ItemError<'py>> {
    let mut tmp = Vec::new();
    let iter = obj.try_iter().map_err(|e| (usize::MAX, obj.clone(), e))?;
    for (i, item) in iter.enumerate() {
        let item = item.map_err(|e| (i, obj.clone(), e))?;
        tmp.push(extract(&item).map_err(|e| (i, item, e))?);
    }
    let v = blocks.room(tmp.len());
    let start = v.len();
    v.extend_from_slice(&tmp);
    let end = v.len();
    Ok(Run { block: blocks.last_index(), start, end, exact_list: false })
}

/// An exact Python int as `i64`, without reference counting or running Python code.
fn fast_int(item: *mut ffi::PyObject) -> Option<i64> {
    // SAFETY: `item` is a live object; for an exact int the conversion cannot run Python code and
    // never fails (overflow is reported in the flag).
    unsafe {
        if ffi::PyLong_CheckExact(item) == 0 {
            return None;
        }
        let mut overflow = 0;
        let v = ffi::PyLong_AsLongLongAndOverflow(item, &mut overflow);
        (overflow == 0).then_some(v)
    }
}

/// An exact Python int that fits in `i32`.
fn fast_int32(item: *mut ffi::PyObject) -> Option<i32> {
    fast_int(item).and_then(|v| i32::try_from(v).ok())
}

/// An exact Python float as `f64`, without reference counting or running Python code.
fn fast_float(item: *mut ffi::PyObject) -> Option<f64> {
    // SAFETY: `item` is a live object; an exact float converts without running Python code.
    unsafe { (ffi::PyFloat_CheckExact(item) != 0).then(|| ffi::PyFloat_AsDouble(item)) }
}

fn is_text(obj: &Bound<'_, PyAny>) -> bool {
    obj.is_instance_of::<pyo3::types::PyString>() || obj.is_instance_of::<pyo3::types::PyBytes>()
}

/// Read tokens: an int32/int64 numpy array (borrowed) or a list / tuple / sequence of ints
/// (into `arena`). `pos0` is added to positions in error messages (the chunk's place in its
/// observation).
pub fn tokens<'py>(
    obj: &Bound<'py, PyAny>,
    at: Location,
    what: &str,
    pos0: usize,
    arena: &mut Arena,
) -> PyResult<TokOwner<'py>> {
    if let Ok(arr) = obj.cast::<PyUntypedArray>() {
        one_d(arr, at, what)?;
        return if is_dtype::<i64>(arr) {
            Ok(TokOwner::I64(borrow_array(arr, at, what)?))
        } else if is_dtype::<i32>(arr) {
            Ok(TokOwner::I32(borrow_array(arr, at, what)?))
        } else {
            Err(located(at, format!("{what}: expected an int32 or int64 array, got dtype {}", dtype_name(arr))))
        };
    }
    if is_text(obj) {
        return Err(located(at, format!("{what}: expected token ids, got {}", type_name(obj))));
    }
    let read = if let Ok(list) = obj.cast::<PyList>() {
        // Token ids fit in `i32`; a list that does not is read again as `i64` (and any real
        // error is reported by that second read).
        if let Ok(run) = list_values(list, &mut arena.ints32, fast_int32, |item| item.extract::<i32>()) {
            return Ok(TokOwner::Arena32(run));
        }
        list_values(list, &mut arena.ints, fast_int, |item| item.extract::<i64>())
    } else {
        iter_values(obj, &mut arena.ints, |item| item.extract::<i64>())
    };
    read.map(TokOwner::Arena).map_err(|(i, item, err)| {
        let e = if i == usize::MAX {
            located(at, format!("{what}: expected a list or array of token ids, got {}", type_name(obj)))
        } else {
            let msg = format!("{what}[{i}] is not a token id (an int in int64 range): got {}", type_name(&item));
            located(at.at(pos0 + i), msg)
        };
        e.set_cause(obj.py(), Some(err));
        e
    })
}

/// Read floats: a float32/float64 numpy array (borrowed) or a list / tuple / sequence of
/// numbers (into `arena`).
pub fn floats<'py>(
    obj: &Bound<'py, PyAny>,
    at: Location,
    what: &str,
    arena: &mut Blocks<f64>,
) -> PyResult<FloatOwner<'py>> {
    if let Ok(arr) = obj.cast::<PyUntypedArray>() {
        one_d(arr, at, what)?;
        return if is_dtype::<f32>(arr) {
            Ok(FloatOwner::F32(borrow_array(arr, at, what)?))
        } else if is_dtype::<f64>(arr) {
            Ok(FloatOwner::F64(borrow_array(arr, at, what)?))
        } else {
            Err(located(at, format!("{what}: expected a float32 or float64 array, got dtype {}", dtype_name(arr))))
        };
    }
    if is_text(obj) {
        return Err(located(at, format!("{what}: expected numbers, got {}", type_name(obj))));
    }
    let read = if let Ok(list) = obj.cast::<PyList>() {
        list_values(list, arena, fast_float, |item| item.extract::<f64>())
    } else {
        iter_values(obj, arena, |item| item.extract::<f64>())
    };
    read.map(FloatOwner::Arena).map_err(|(i, item, err)| {
        let e = if i == usize::MAX {
            located(at, format!("{what}: expected a list or array of numbers, got {}", type_name(obj)))
        } else {
            located(at.at(i), format!("{what}[{i}] is not a number: got {}", type_name(&item)))
        };
        e.set_cause(obj.py(), Some(err));
        e
    })
}

/// Read a few floats (per-member values) into a `Vec<f64>`.
pub fn float_values(obj: &Bound<'_, PyAny>, at: Location, what: &str) -> PyResult<Vec<f64>> {
    let mut arena = Arena::default();
    let owner = floats(obj, at, what, &mut arena.floats)?;
    let v = owner.view(&arena);
    Ok((0..v.len()).map(|i| v.get(i)).collect())
}

/// `getattr`, with a located error naming the attribute.
pub fn attr<'py>(
    obj: &Bound<'py, PyAny>,
    name: &Bound<'py, pyo3::types::PyString>,
    at: Location,
) -> PyResult<Bound<'py, PyAny>> {
    obj.getattr(name).map_err(|e| {
        let msg = format!("expected an object with .{name}, got {}", type_name(obj));
        wrap(at, &msg, e)
    })
}

/// Iterate a Python iterable, with a located error if it is not one.
pub fn items<'py>(obj: &Bound<'py, PyAny>, at: Location, what: &str) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if let Ok(list) = obj.cast::<PyList>() {
        return Ok(list.iter().collect());
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return Ok(tuple.iter().collect());
    }
    let iter =
        obj.try_iter().map_err(|e| wrap(at, &format!("{what}: expected a sequence, got {}", type_name(obj)), e))?;
    iter.map(|r| r.map_err(|e| wrap(at, what, e))).collect()
}

/// A chunk of a model input, before views are taken.
pub enum ChunkSpec {
    /// Index into [`ModelInputs::tokens`].
    Tokens(usize),
    Opaque {
        class: u64,
        len: usize,
        handle: usize,
    },
}

static ENCODED_TEXT_CHUNK: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// The chunks of many model inputs, read once, viewed later.
#[derive(Default)]
pub struct ModelInputs<'py> {
    /// Values read from lists, for these model inputs and for anything else the caller reads.
    pub arena: Arena,
    pub tokens: Vec<TokOwner<'py>>,
    /// The Python object each of [`Self::tokens`] was read from.
    pub token_sources: Vec<Bound<'py, PyAny>>,
    pub chunks: Vec<ChunkSpec>,
    /// The opaque chunks, by handle.
    pub opaque: Vec<Bound<'py, PyAny>>,
    /// Equality classes of opaque chunks: key -> class.
    classes: Option<Bound<'py, PyDict>>,
    /// Model inputs already read, by object identity -> their chunk range. Members of a group
    /// usually share one prompt object: it is read once. The objects are kept alive here, so an
    /// address cannot be reused by another object while reading.
    seen: HashMap<usize, (Bound<'py, PyAny>, std::ops::Range<usize>)>,
    /// Token containers already read, by object identity -> index in [`Self::tokens`]: an
    /// observation built by appending chunks to the previous one shares its chunks' token
    /// lists, which are then read once.
    seen_tokens: HashMap<usize, (Bound<'py, PyAny>, usize)>,
}

impl<'py> ModelInputs<'py> {
    /// Read the chunks of `model_input` (anything with `.chunks`); returns their range in
    /// [`Self::chunks`].
    pub fn read(
        &mut self,
        model_input: &Bound<'py, PyAny>,
        at: Location,
        what: &str,
    ) -> PyResult<std::ops::Range<usize>> {
        let key = model_input.as_ptr() as usize;
        if let Some((_, range)) = self.seen.get(&key) {
            return Ok(range.clone());
        }
        let range = self.read_new(model_input, at, what)?;
        self.seen.insert(key, (model_input.clone(), range.clone()));
        Ok(range)
    }

    fn read_new(
        &mut self,
        model_input: &Bound<'py, PyAny>,
        at: Location,
        what: &str,
    ) -> PyResult<std::ops::Range<usize>> {
        let py = model_input.py();
        let text_type = ENCODED_TEXT_CHUNK.import(py, "tinker.types", "EncodedTextChunk")?;
        let chunks = attr(model_input, intern!(py, "chunks"), at)?;
        let start = self.chunks.len();
        let mut pos = 0usize;
        for (i, chunk) in items(&chunks, at, &format!("{what}.chunks"))?.into_iter().enumerate() {
            if chunk.get_type().is(text_type) || chunk.is_instance(text_type).unwrap_or(false) {
                let toks = attr(&chunk, intern!(py, "tokens"), at)?;
                let key = toks.as_ptr() as usize;
                let index = match self.seen_tokens.get(&key) {
                    Some(&(_, index)) => index,
                    None => {
                        let owner = tokens(&toks, at, &format!("{what}.chunks[{i}].tokens"), pos, &mut self.arena)?;
                        self.tokens.push(owner);
                        self.token_sources.push(toks.clone());
                        self.seen_tokens.insert(key, (toks, self.tokens.len() - 1));
                        self.tokens.len() - 1
                    }
                };
                pos += self.tokens[index].len();
                self.chunks.push(ChunkSpec::Tokens(index));
            } else {
                let len = chunk.getattr(intern!(py, "length")).and_then(|l| l.extract::<usize>()).map_err(|e| {
                    wrap(at, &format!("{what}.chunks[{i}] ({}) has no usable .length", type_name(&chunk)), e)
                })?;
                let class = self.class_of(&chunk)?;
                self.chunks.push(ChunkSpec::Opaque { class, len, handle: self.opaque.len() });
                self.opaque.push(chunk);
                pos += len;
            }
        }
        Ok(start..self.chunks.len())
    }

    /// The equality class of an opaque chunk: chunks of one type with equal fields (e.g. the
    /// same image bytes, format and size) share a class. The key is
    /// `(type(chunk), tuple(vars(chunk).items()))`, looked up in a dict, so Python's own `==` on
    /// the field values decides, with hashing keeping it linear. A chunk whose fields cannot be
    /// hashed is equal only to itself (identity): never merges different content, at worst
    /// splits a sequence that could have been merged.
    fn class_of(&mut self, chunk: &Bound<'py, PyAny>) -> PyResult<u64> {
        let py = chunk.py();
        let classes = self.classes.get_or_insert_with(|| PyDict::new(py)).clone();
        let key = (|| -> PyResult<Bound<'py, PyAny>> {
            let fields = chunk.getattr(intern!(py, "__dict__"))?.cast_into::<PyDict>()?;
            let items = PyTuple::new(py, fields.items())?;
            let key = PyTuple::new(py, [chunk.get_type().into_any(), items.into_any()])?.into_any();
            key.hash()?;
            Ok(key)
        })()
        .or_else(|_| -> PyResult<Bound<'py, PyAny>> {
            Ok(PyTuple::new(
                py,
                [
                    pyo3::types::PyString::new(py, "id").into_any(),
                    (chunk.as_ptr() as usize).into_pyobject(py)?.into_any(),
                ],
            )?
            .into_any())
        })?;
        if let Some(c) = classes.get_item(&key)? {
            return c.extract();
        }
        let c = classes.len() as u64;
        classes.set_item(key, c)?;
        Ok(c)
    }

    /// Views of all chunks, in order.
    pub fn views(&self) -> Vec<Chunk<'_>> {
        self.chunks
            .iter()
            .map(|c| match *c {
                ChunkSpec::Tokens(i) => Chunk::Tokens(self.tokens[i].view(&self.arena)),
                ChunkSpec::Opaque { class, len, handle } => Chunk::Opaque { class, len, handle },
            })
            .collect()
    }
}

/// The `bool` value of an optional attribute (`default` when absent).
pub fn flag<'py>(
    obj: &Bound<'py, PyAny>,
    name: &Bound<'py, pyo3::types::PyString>,
    default: bool,
    at: Location,
) -> PyResult<bool> {
    match obj.getattr_opt(name) {
        Ok(Some(v)) => v.is_truthy().map_err(|e| wrap(at, &format!(".{name}"), e)),
        Ok(None) => Ok(default),
        Err(e) => Err(wrap(at, &format!(".{name}"), e)),
    }
}
