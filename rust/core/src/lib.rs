//! The data path of tempering, with no Python in it.
//!
//! Ragged data travels Arrow-style: one flat buffer plus an offsets array.
//! A ragged array of `n` rows has `offsets.len() == n + 1`, `offsets[0] == 0`,
//! offsets non-decreasing, and row `i` is `values[offsets[i]..offsets[i + 1]]`.
//!
//! Shape suffixes follow docs/notation.md: `_P` problems (groups), `_G` members of a
//! group, `_T` tokens, `_D` datums, `_N` all positions of a ragged batch, `_X` all
//! transitions, `_C` all opaque (non-token) chunks (`_K` stays for alternatives per position).
//!
//! | module | what |
//! | --- | --- |
//! | [`ragged`] | offsets validation |
//! | [`chunks`] | borrowed token / float runs, model-input chunks, the prefix test |
//! | [`datums`] | trajectories → datums (RL packing) into a columnar batch |
//! | [`supervised`] | tokens + weights → supervised datums, truncation |
//! | [`advantages`] | total rewards, group advantages, constant-reward groups |
//! | [`kl`] | KL penalty against reference logprobs, applied to advantages |

#![allow(non_snake_case)]

pub mod advantages;
pub mod chunks;
pub mod datums;
pub mod error;
pub mod kl;
pub mod ragged;
pub mod supervised;
#[cfg(test)]
pub(crate) mod testutil;

pub use error::{DataError, Location};
