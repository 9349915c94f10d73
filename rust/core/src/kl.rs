//! A KL penalty against a reference model, folded into the advantages.
//!
//! For each trained position `t` (mask `m_t != 0`) the sampled-minus-reference log-ratio is
//! `d_t = m_t * (logprob_t - ref_logprob_t)`; untrained positions have `d_t = 0` whatever their
//! logprobs are. The batch mean `d̄ = Σ d_t / Σ m_t` (0 when nothing is trained) estimates
//! KL(sampler ‖ reference). The penalty, centred over the batch, is
//! `k_t = coef * m_t * (d̄ - d_t)`: tokens more likely under the sampler than under the
//! reference, relative to the batch, lose advantage. With `discount > 0` the penalty becomes
//! its discounted future sum within each datum, `k'_t = k_t + discount * k'_{t+1}`.
//! The new advantage is `advantage_t + k'_t`.
//!
//! All arithmetic is in `f64`, sums left to right over datums then positions; results are
//! rounded to `f32` once at the end.

use crate::chunks::Floats;
use crate::error::Location;
use crate::ragged::validate_offsets;
use crate::DataError;

/// New advantages and the batch mean log-ratio.
#[derive(Debug, Clone, PartialEq)]
pub struct KlOut {
    pub advantages_N: Vec<f32>,
    /// `d̄`: mean of `logprob - ref_logprob` over trained positions.
    pub mean_logprob_diff: f64,
}

/// The per-position inputs of [`kl_penalty`], all of length `N`.
#[derive(Debug, Clone, Copy)]
pub struct KlIn<'a> {
    pub logprobs_N: Floats<'a>,
    pub ref_logprobs_N: Floats<'a>,
    pub mask_N: Floats<'a>,
    pub advantages_N: Floats<'a>,
    /// `D + 1` offsets over `N`.
    pub offsets_D1: &'a [usize],
}

/// The datum of position `i`, and `i`'s position in it (for error messages).
fn locate(offsets_d1: &[usize], i: usize) -> Location {
    let d = offsets_d1.partition_point(|&o| o <= i).saturating_sub(1);
    Location::datum(d).at(i - offsets_d1[d])
}

pub fn kl_penalty(input: &KlIn<'_>, coef: f64, discount: f64) -> Result<KlOut, DataError> {
    let n = input.logprobs_N.len();
    validate_offsets("offsets_D1", input.offsets_D1, n)?;
    for (what, f) in
        [("ref_logprobs_N", input.ref_logprobs_N), ("mask_N", input.mask_N), ("advantages_N", input.advantages_N)]
    {
        if f.len() != n {
            return Err(DataError::LengthMismatch {
                what: format!("{what} (one per position of logprobs_N)"),
                expected: n,
                got: f.len(),
            });
        }
    }
    if !coef.is_finite() {
        return Err(DataError::InvalidArgument(format!("kl coefficient must be finite, got {coef}")));
    }
    if !(0.0..=1.0).contains(&discount) {
        return Err(DataError::InvalidArgument(format!("kl discount must be in [0, 1], got {discount}")));
    }
    if let Some(i) = input.mask_N.first_non_finite() {
        return Err(DataError::at(locate(input.offsets_D1, i), "mask is not finite"));
    }
    if let Some(i) = input.advantages_N.first_non_finite() {
        return Err(DataError::at(locate(input.offsets_D1, i), "advantage is not finite"));
    }
    let mut diff = vec![0.0f64; n];
    let (mut sum_diff, mut sum_mask) = (0.0f64, 0.0f64);
    for (i, d) in diff.iter_mut().enumerate() {
        let m = input.mask_N.get(i);
        if m == 0.0 {
            continue;
        }
        let (lp, rf) = (input.logprobs_N.get(i), input.ref_logprobs_N.get(i));
        if !lp.is_finite() || !rf.is_finite() {
            return Err(DataError::at(
                locate(input.offsets_D1, i),
                format!("a trained position needs finite logprobs; sampled {lp}, reference {rf}"),
            ));
        }
        *d = m * (lp - rf);
        sum_diff += *d;
        sum_mask += m;
    }
    let mean = if sum_mask > 0.0 { sum_diff / sum_mask } else { 0.0 };
    let mut out = vec![0.0f32; n];
    for w in input.offsets_D1.windows(2) {
        let mut acc = 0.0f64;
        for i in (w[0]..w[1]).rev() {
            let k = coef * input.mask_N.get(i) * (mean - diff[i]);
            acc = if discount > 0.0 { k + discount * acc } else { k };
            out[i] = (input.advantages_N.get(i) + acc) as f32;
        }
    }
    Ok(KlOut { advantages_N: out, mean_logprob_diff: mean })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn centred_penalty_on_trained_positions_only() {
        let lp = [0.0f32, -1.0, -1.0, -2.0];
        let rf = [f64::NAN, -2.0, -1.0, -1.0]; // NaN on an untrained position is ignored
        let mask = [0.0f32, 1.0, 1.0, 1.0];
        let adv = [0.0f32, 1.0, 1.0, 1.0];
        let input = KlIn {
            logprobs_N: Floats::F32(&lp),
            ref_logprobs_N: Floats::F64(&rf),
            mask_N: Floats::F32(&mask),
            advantages_N: Floats::F32(&adv),
            offsets_D1: &[0, 2, 4],
        };
        let out = kl_penalty(&input, 0.5, 0.0).unwrap();
        // d = [0, 1, 0, -1], mean 0 -> k = 0.5 * (0 - d)
        assert_eq!(out.mean_logprob_diff, 0.0);
        assert_eq!(out.advantages_N, vec![0.0, 0.5, 1.0, 1.5]);
        // Discounted within each datum: k = [0, -0.5 | 0, 0.5] -> [-0.25, -0.5 | 0.25, 0.5].
        let out = kl_penalty(&input, 0.5, 0.5).unwrap();
        assert_eq!(out.advantages_N, vec![-0.25, 0.5, 1.25, 1.5]);
        // The inputs are not touched: the caller gets new advantages.
        assert_eq!(adv, [0.0, 1.0, 1.0, 1.0]);
    }

    #[test]
    fn nothing_trained_means_no_penalty() {
        let z = [0.0f32; 3];
        let input = KlIn {
            logprobs_N: Floats::F32(&z),
            ref_logprobs_N: Floats::F32(&[-1.0; 3]),
            mask_N: Floats::F32(&z),
            advantages_N: Floats::F32(&[1.0; 3]),
            offsets_D1: &[0, 3],
        };
        let out = kl_penalty(&input, 1.0, 0.0).unwrap();
        assert_eq!(out.mean_logprob_diff, 0.0);
        assert_eq!(out.advantages_N, vec![1.0; 3]);
    }

    #[test]
    fn rejects_bad_input_with_the_datum_and_position() {
        let one = [1.0f32; 4];
        let bad = [0.0f64, 0.0, 0.0, f64::NEG_INFINITY];
        let input = KlIn {
            logprobs_N: Floats::F32(&one),
            ref_logprobs_N: Floats::F64(&bad),
            mask_N: Floats::F32(&one),
            advantages_N: Floats::F32(&one),
            offsets_D1: &[0, 2, 2, 4],
        };
        let e = kl_penalty(&input, 1.0, 0.0).unwrap_err().to_string();
        assert!(e.starts_with("datum 2, token 1:"), "{e}");
        let e = kl_penalty(&KlIn { ref_logprobs_N: Floats::F32(&one[..3]), ..input }, 1.0, 0.0).unwrap_err();
        assert!(e.to_string().contains("ref_logprobs_N"), "{e}");
        assert!(kl_penalty(&input, f64::NAN, 0.0).is_err());
        assert!(kl_penalty(&input, 1.0, 1.5).is_err());
    }
}
