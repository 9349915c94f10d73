//! Validation helpers for Arrow-style offsets.

use crate::DataError;

/// Check that `offsets` describes `offsets.len() - 1` rows over exactly `n_values` values.
pub fn validate_offsets(what: &'static str, offsets: &[usize], n_values: usize) -> Result<(), DataError> {
    let bad = |detail: String| DataError::BadOffsets { what, detail };
    let (Some(&first), Some(&last)) = (offsets.first(), offsets.last()) else {
        return Err(bad("offsets must have at least one element (0)".into()));
    };
    if first != 0 {
        return Err(bad(format!("offsets[0] must be 0, got {first}")));
    }
    if let Some(i) = offsets.windows(2).position(|w| w[1] < w[0]) {
        return Err(bad(format!(
            "offsets must be non-decreasing, but offsets[{}]={} > offsets[{}]={}",
            i,
            offsets[i],
            i + 1,
            offsets[i + 1]
        )));
    }
    if last != n_values {
        return Err(bad(format!("last offset is {last} but there are {n_values} values")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_valid_and_empty_rows() {
        assert!(validate_offsets("x", &[0, 2, 2, 5], 5).is_ok());
        assert!(validate_offsets("x", &[0], 0).is_ok());
    }

    #[test]
    fn rejects_each_malformation() {
        assert!(matches!(validate_offsets("x", &[], 0), Err(DataError::BadOffsets { .. })));
        assert!(validate_offsets("x", &[1, 2], 2).unwrap_err().to_string().contains("offsets[0] must be 0"));
        assert!(validate_offsets("x", &[0, 3, 2], 2).unwrap_err().to_string().contains("non-decreasing"));
        assert!(validate_offsets("x", &[0, 2], 3).unwrap_err().to_string().contains("3 values"));
    }
}
