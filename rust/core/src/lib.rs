//! The data path of tempering, with no Python in it.
//!
//! Ragged data travels Arrow-style: one flat buffer plus an offsets array.
//! A ragged array of `n` rows has `offsets.len() == n + 1`, `offsets[0] == 0`,
//! offsets non-decreasing, and row `i` is `values[offsets[i]..offsets[i + 1]]`.
//!
//! Shape suffixes follow docs/notation.md: `_P` problems (groups), `_G` members of a
//! group, `_T` tokens, `_D` datums.

pub mod advantages;
pub mod error;
pub mod ragged;

pub use error::DataError;
