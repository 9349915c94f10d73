//! Reading Python inputs (with the GIL held) into borrowed views for the core.
//!
//! numpy arrays are borrowed in place (read-only borrow, no copy); Python lists and tuples of
//! ints / floats are read into one `Vec` each. Anything malformed becomes a `DataError` that
//! says where it is (problem, member, transition, token) and what was expected.

use numpy::prelude::*;
use numpy::{PyArray1, PyReadonlyArray1, PyUntypedArray};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyTuple, PyType};

use tempering_core::chunks::{Chunk, Floats, Tokens};
use tempering_core::{DataError as CoreError, Location};

use crate::data_err;

/// A located error, as a Python `DataError`.
pub fn located(at: Location, what: impl Into<String>) -> PyErr {
    data_err(CoreError::at(at, what))
}

/// Wrap an error raised by Python code while reading a located value.
fn wrap(at: Location, what: &str, err: PyErr) -> PyErr {
    let e = located(at, format!("{what}: {err}"));
    Python::attach(|py| e.set_cause(py, Some(err)));
    e
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |n| n.to_string())
}

/// Tokens, held as the caller gave them.
pub enum TokOwner<'py> {
    I32(PyReadonlyArray1<'py, i32>),
    I64(PyReadonlyArray1<'py, i64>),
    Vec(Vec<i64>),
}

impl TokOwner<'_> {
    /// A view of the tokens. Contiguity was checked when the array was read.
    pub fn view(&self) -> Tokens<'_> {
        match self {
            Self::I32(a) => Tokens::I32(a.as_slice().unwrap_or_default()),
            Self::I64(a) => Tokens::I64(a.as_slice().unwrap_or_default()),
            Self::Vec(v) => Tokens::I64(v),
        }
    }
}

/// Floats, held as the caller gave them.
pub enum FloatOwner<'py> {
    F32(PyReadonlyArray1<'py, f32>),
    F64(PyReadonlyArray1<'py, f64>),
    Vec(Vec<f64>),
}

impl FloatOwner<'_> {
    pub fn view(&self) -> Floats<'_> {
        match self {
            Self::F32(a) => Floats::F32(a.as_slice().unwrap_or_default()),
            Self::F64(a) => Floats::F64(a.as_slice().unwrap_or_default()),
            Self::Vec(v) => Floats::F64(v),
        }
    }
}

/// Borrow a 1-D numpy array of element type `T`, or explain why not.
fn borrow_array<'py, T: numpy::Element>(
    arr: &Bound<'py, PyUntypedArray>,
    at: Location,
    what: &str,
) -> PyResult<PyReadonlyArray1<'py, T>> {
    let typed = arr
        .cast::<PyArray1<T>>()
        .map_err(|_| located(at, format!("{what}: unexpected array type")))?;
    let ro = typed.try_readonly().map_err(|e| {
        located(
            at,
            format!("{what}: the array cannot be borrowed for reading ({e})"),
        )
    })?;
    if ro.as_slice().is_err() {
        return Err(located(
            at,
            format!("{what} must be a C-contiguous 1-D array (got a strided view); pass np.ascontiguousarray(...)"),
        ));
    }
    Ok(ro)
}

/// A numpy array's dtype, checked to be 1-D.
fn array_dtype<'py>(
    arr: &Bound<'py, PyUntypedArray>,
    at: Location,
    what: &str,
) -> PyResult<String> {
    if arr.ndim() != 1 {
        return Err(located(
            at,
            format!("{what} must be a 1-D array, got {} dimensions", arr.ndim()),
        ));
    }
    Ok(arr
        .dtype()
        .str()
        .map_or_else(|_| "?".to_owned(), |s| s.to_string()))
}

fn is_dtype<T: numpy::Element>(arr: &Bound<'_, PyUntypedArray>) -> bool {
    arr.dtype().is_equiv_to(&numpy::dtype::<T>(arr.py()))
}

/// Read tokens: an int32/int64 numpy array (borrowed) or a list / tuple / sequence of ints.
/// `pos0` is added to positions in error messages (the chunk's place in its observation).
pub fn tokens<'py>(
    obj: &Bound<'py, PyAny>,
    at: Location,
    what: &str,
    pos0: usize,
) -> PyResult<TokOwner<'py>> {
    if let Ok(arr) = obj.cast::<PyUntypedArray>() {
        let dtype = array_dtype(arr, at, what)?;
        return if is_dtype::<i64>(arr) {
            Ok(TokOwner::I64(borrow_array(arr, at, what)?))
        } else if is_dtype::<i32>(arr) {
            Ok(TokOwner::I32(borrow_array(arr, at, what)?))
        } else {
            Err(located(
                at,
                format!("{what}: expected an int32 or int64 array, got dtype {dtype}"),
            ))
        };
    }
    let bad = |i: usize, item: &Bound<'py, PyAny>, err: PyErr| {
        let msg = format!(
            "{what}[{i}] is not a token id (an int in int64 range): got {}",
            type_name(item)
        );
        let e = located(at.at(pos0 + i), msg);
        e.set_cause(obj.py(), Some(err));
        e
    };
    if let Ok(list) = obj.cast::<PyList>() {
        let mut v = Vec::with_capacity(list.len());
        for (i, item) in list.iter().enumerate() {
            v.push(item.extract::<i64>().map_err(|e| bad(i, &item, e))?);
        }
        return Ok(TokOwner::Vec(v));
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        let mut v = Vec::with_capacity(tuple.len());
        for (i, item) in tuple.iter().enumerate() {
            v.push(item.extract::<i64>().map_err(|e| bad(i, &item, e))?);
        }
        return Ok(TokOwner::Vec(v));
    }
    if obj.is_instance_of::<pyo3::types::PyString>() || obj.is_instance_of::<pyo3::types::PyBytes>()
    {
        return Err(located(
            at,
            format!("{what}: expected token ids, got {}", type_name(obj)),
        ));
    }
    // Any other sequence (a torch tensor, a range, ...): generic, slower path.
    let mut v = Vec::new();
    let iter = obj.try_iter().map_err(|e| {
        wrap(
            at,
            &format!(
                "{what}: expected a list or array of token ids, got {}",
                type_name(obj)
            ),
            e,
        )
    })?;
    for (i, item) in iter.enumerate() {
        let item = item.map_err(|e| wrap(at, what, e))?;
        v.push(item.extract::<i64>().map_err(|e| bad(i, &item, e))?);
    }
    Ok(TokOwner::Vec(v))
}

/// Read floats: a float32/float64 numpy array (borrowed) or a list / tuple / sequence of numbers.
pub fn floats<'py>(obj: &Bound<'py, PyAny>, at: Location, what: &str) -> PyResult<FloatOwner<'py>> {
    if let Ok(arr) = obj.cast::<PyUntypedArray>() {
        let dtype = array_dtype(arr, at, what)?;
        return if is_dtype::<f32>(arr) {
            Ok(FloatOwner::F32(borrow_array(arr, at, what)?))
        } else if is_dtype::<f64>(arr) {
            Ok(FloatOwner::F64(borrow_array(arr, at, what)?))
        } else {
            Err(located(
                at,
                format!("{what}: expected a float32 or float64 array, got dtype {dtype}"),
            ))
        };
    }
    let bad = |i: usize, item: &Bound<'py, PyAny>, err: PyErr| {
        let e = located(
            at.at(i),
            format!("{what}[{i}] is not a number: got {}", type_name(item)),
        );
        e.set_cause(obj.py(), Some(err));
        e
    };
    if let Ok(list) = obj.cast::<PyList>() {
        let mut v = Vec::with_capacity(list.len());
        for (i, item) in list.iter().enumerate() {
            v.push(item.extract::<f64>().map_err(|e| bad(i, &item, e))?);
        }
        return Ok(FloatOwner::Vec(v));
    }
    if obj.is_instance_of::<pyo3::types::PyString>() || obj.is_instance_of::<pyo3::types::PyBytes>()
    {
        return Err(located(
            at,
            format!("{what}: expected numbers, got {}", type_name(obj)),
        ));
    }
    let mut v = Vec::new();
    let iter = obj.try_iter().map_err(|e| {
        wrap(
            at,
            &format!(
                "{what}: expected a list or array of numbers, got {}",
                type_name(obj)
            ),
            e,
        )
    })?;
    for (i, item) in iter.enumerate() {
        let item = item.map_err(|e| wrap(at, what, e))?;
        v.push(item.extract::<f64>().map_err(|e| bad(i, &item, e))?);
    }
    Ok(FloatOwner::Vec(v))
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
pub fn items<'py>(
    obj: &Bound<'py, PyAny>,
    at: Location,
    what: &str,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if let Ok(list) = obj.cast::<PyList>() {
        return Ok(list.iter().collect());
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return Ok(tuple.iter().collect());
    }
    let iter = obj.try_iter().map_err(|e| {
        wrap(
            at,
            &format!("{what}: expected a sequence, got {}", type_name(obj)),
            e,
        )
    })?;
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
    pub tokens: Vec<TokOwner<'py>>,
    pub chunks: Vec<ChunkSpec>,
    /// The opaque chunks, by handle.
    pub opaque: Vec<Bound<'py, PyAny>>,
    /// Equality classes of opaque chunks: key -> class.
    classes: Option<Bound<'py, PyDict>>,
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
        let py = model_input.py();
        let text_type = ENCODED_TEXT_CHUNK.import(py, "tinker.types", "EncodedTextChunk")?;
        let chunks = attr(model_input, intern!(py, "chunks"), at)?;
        let start = self.chunks.len();
        let mut pos = 0usize;
        for (i, chunk) in items(&chunks, at, &format!("{what}.chunks"))?
            .into_iter()
            .enumerate()
        {
            if chunk.get_type().is(text_type) || chunk.is_instance(text_type)? {
                let toks = attr(&chunk, intern!(py, "tokens"), at)?;
                let owner = tokens(&toks, at, &format!("{what}.chunks[{i}].tokens"), pos)?;
                pos += owner.view().len();
                self.chunks.push(ChunkSpec::Tokens(self.tokens.len()));
                self.tokens.push(owner);
            } else {
                let len = chunk
                    .getattr(intern!(py, "length"))
                    .and_then(|l| l.extract::<usize>())
                    .map_err(|e| {
                        wrap(
                            at,
                            &format!(
                                "{what}.chunks[{i}] ({}) has no usable .length",
                                type_name(&chunk)
                            ),
                            e,
                        )
                    })?;
                let class = self.class_of(&chunk)?;
                self.chunks.push(ChunkSpec::Opaque {
                    class,
                    len,
                    handle: self.opaque.len(),
                });
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
            let fields = chunk
                .getattr(intern!(py, "__dict__"))?
                .cast_into::<PyDict>()?;
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
                ChunkSpec::Tokens(i) => Chunk::Tokens(self.tokens[i].view()),
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
