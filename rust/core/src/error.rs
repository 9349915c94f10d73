//! One error type for everything the data core rejects.

use std::fmt;

/// Bad input to the data core. Every variant names where the problem is, so a user
/// can find the offending problem / group member / transition / token.
#[derive(Debug, Clone, PartialEq)]
pub enum DataError {
    /// An offsets array that does not describe a ragged layout over `len` values.
    BadOffsets { what: &'static str, detail: String },
    /// A group with no members.
    EmptyGroup { group: usize },
    /// A reward that is NaN or infinite.
    NonFiniteReward { group: usize, member: usize, value: f64 },
    /// Two arrays that must have the same length do not.
    LengthMismatch { what: String, expected: usize, got: usize },
    /// An option value the core does not know.
    InvalidArgument(String),
}

impl fmt::Display for DataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadOffsets { what, detail } => write!(f, "invalid offsets for {what}: {detail}"),
            Self::EmptyGroup { group } => write!(f, "group {group} is empty: a group needs at least one member"),
            Self::NonFiniteReward { group, member, value } => {
                write!(f, "reward of group {group}, member {member} is not finite ({value})")
            }
            Self::LengthMismatch { what, expected, got } => {
                write!(f, "{what}: expected length {expected}, got {got}")
            }
            Self::InvalidArgument(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for DataError {}
