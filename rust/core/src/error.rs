//! One error type for everything the data core rejects.

use std::fmt;

/// Where in a batch something is wrong. Every field is optional; the ones that are set are
/// printed in a fixed order, e.g. `problem 3, member 1, transition 2, token 17`.
///
/// `problem` / `member` / `transition` locate a turn of an RL batch; `example` locates a
/// supervised example; `datum` a datum of a packed batch; `position` a token position inside
/// the thing located before it (an action, an observation, a datum).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Location {
    pub problem: Option<usize>,
    pub member: Option<usize>,
    pub transition: Option<usize>,
    pub example: Option<usize>,
    pub datum: Option<usize>,
    pub position: Option<usize>,
}

impl Location {
    /// The location of a whole problem (env group).
    pub fn problem(p: usize) -> Self {
        Self { problem: Some(p), ..Self::default() }
    }

    /// The location of a trajectory: problem `p`, member `g`.
    pub fn member(p: usize, g: usize) -> Self {
        Self { problem: Some(p), member: Some(g), ..Self::default() }
    }

    /// The location of a turn: problem `p`, member `g`, transition `x`.
    pub fn transition(p: usize, g: usize, x: usize) -> Self {
        Self { problem: Some(p), member: Some(g), transition: Some(x), ..Self::default() }
    }

    /// The location of a supervised example.
    pub fn example(i: usize) -> Self {
        Self { example: Some(i), ..Self::default() }
    }

    /// The location of a datum of a packed batch.
    pub fn datum(d: usize) -> Self {
        Self { datum: Some(d), ..Self::default() }
    }

    /// The same location, narrowed to token position `t`.
    #[must_use]
    pub fn at(self, t: usize) -> Self {
        Self { position: Some(t), ..self }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts = [
            ("problem", self.problem),
            ("member", self.member),
            ("transition", self.transition),
            ("example", self.example),
            ("datum", self.datum),
            ("token", self.position),
        ];
        let mut first = true;
        for (name, value) in parts {
            if let Some(v) = value {
                if !first {
                    f.write_str(", ")?;
                }
                write!(f, "{name} {v}")?;
                first = false;
            }
        }
        if first {
            f.write_str("batch")?;
        }
        Ok(())
    }
}

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
    /// Anything else wrong with one located piece of the input.
    At { at: Location, what: String },
}

impl DataError {
    /// A located error: `at` says where, `what` says what is wrong there.
    pub fn at(at: Location, what: impl Into<String>) -> Self {
        Self::At { at, what: what.into() }
    }
}

impl fmt::Display for DataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadOffsets { what, detail } => write!(f, "invalid offsets for {what}: {detail}"),
            Self::EmptyGroup { group } => {
                write!(f, "problem {group}: the group is empty; a group needs at least one member")
            }
            Self::NonFiniteReward { group, member, value } => {
                write!(f, "problem {group}, member {member}: reward is not finite ({value})")
            }
            Self::LengthMismatch { what, expected, got } => {
                write!(f, "{what}: expected length {expected}, got {got}")
            }
            Self::InvalidArgument(msg) => f.write_str(msg),
            Self::At { at, what } => write!(f, "{at}: {what}"),
        }
    }
}

impl std::error::Error for DataError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_print_in_order() {
        assert_eq!(Location::transition(3, 1, 2).at(17).to_string(), "problem 3, member 1, transition 2, token 17");
        assert_eq!(Location::example(4).to_string(), "example 4");
        assert_eq!(Location::default().to_string(), "batch");
        let e = DataError::at(Location::member(0, 2), "no transitions");
        assert_eq!(e.to_string(), "problem 0, member 2: no transitions");
    }
}
