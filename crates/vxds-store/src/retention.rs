//! How much history the store keeps: the `--history-retention` policy, parsed and checked in
//! one place (the CLI and tests call the same function).
//!
//! A revision is pruned once it is outside any limit given: older than the age, or further
//! than the count behind the head. The head revision is always kept, and so is the state it
//! starts from; pruning happens in the background ([`crate::Store::prune_step`]).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A history retention policy; no limit at all keeps everything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Keep at most this many revisions (at least 1: the head).
    pub revisions: Option<u64>,
    /// Keep revisions committed within this long.
    pub age: Option<Duration>,
}

/// The default: 30 days. At one write a second that is 2.6 M revisions; the disk they take
/// is bounded by the retention, not the store's age.
pub const DEFAULT_RETENTION: Retention = Retention {
    revisions: None,
    age: Some(Duration::from_secs(30 * 24 * 3600)),
};

impl Default for Retention {
    fn default() -> Self {
        DEFAULT_RETENTION
    }
}

impl Retention {
    /// Keeps every revision.
    pub const FOREVER: Retention = Retention {
        revisions: None,
        age: None,
    };

    /// Whether this policy ever prunes.
    pub fn prunes(&self) -> bool {
        self.revisions.is_some() || self.age.is_some()
    }

    /// `forever`, or a comma-separated list of at most one age (`30d`, `720h`) and at most one
    /// revision count (a plain number, `100000`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text == "forever" {
            return Ok(Retention::FOREVER);
        }
        let mut retention = Retention::FOREVER;
        for part in text.split(',').map(str::trim) {
            if part.is_empty() {
                return Err(format!(
                    "`{text}` has an empty part; give an age (`30d`), a revision count (`100000`), both (`30d,100000`) or `forever`"
                ));
            }
            if part.bytes().all(|b| b.is_ascii_digit()) {
                let count: u64 = part
                    .parse()
                    .map_err(|_| format!("revision count `{part}` is too large"))?;
                if count == 0 {
                    return Err(
                        "the revision count must be at least 1 (the head is always kept)".into(),
                    );
                }
                if retention.revisions.replace(count).is_some() {
                    return Err(format!("`{text}` gives two revision counts"));
                }
            } else {
                let age = humantime::parse_duration(part).map_err(|e| {
                    format!("`{part}` is neither a revision count nor an age like `30d`: {e}")
                })?;
                if age.is_zero() {
                    return Err("the age must be longer than 0s".into());
                }
                if retention.age.replace(age).is_some() {
                    return Err(format!("`{text}` gives two ages"));
                }
            }
        }
        Ok(retention)
    }
}

impl FromStr for Retention {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Retention::parse(s)
    }
}

impl fmt::Display for Retention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.age, self.revisions) {
            (None, None) => f.write_str("forever"),
            (Some(age), None) => write!(f, "{}", humantime::format_duration(age)),
            (None, Some(n)) => write!(f, "{n}"),
            (Some(age), Some(n)) => write!(f, "{},{n}", humantime::format_duration(age)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ages_counts_and_both() {
        assert_eq!(Retention::parse("30d").unwrap(), DEFAULT_RETENTION);
        assert_eq!(
            Retention::parse("100000").unwrap(),
            Retention {
                revisions: Some(100_000),
                age: None
            }
        );
        let both = Retention::parse("7d, 5000").unwrap();
        assert_eq!(both.revisions, Some(5000));
        assert_eq!(both.age, Some(Duration::from_secs(7 * 86400)));
        assert_eq!(Retention::parse("forever").unwrap(), Retention::FOREVER);
        assert!(!Retention::FOREVER.prunes());
        for round_trip in ["forever", "30days", "12", "1h,12"] {
            let parsed = Retention::parse(round_trip).unwrap();
            assert_eq!(Retention::parse(&parsed.to_string()).unwrap(), parsed);
        }
    }

    #[test]
    fn refuses_what_it_cannot_mean() {
        for (bad, says) in [
            ("0", "at least 1"),
            ("0s", "longer than 0s"),
            ("30d,1d", "two ages"),
            ("5,6", "two revision counts"),
            ("30d,", "empty part"),
            ("month", "neither a revision count nor an age"),
            ("99999999999999999999999", "too large"),
        ] {
            let error = Retention::parse(bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }
}
