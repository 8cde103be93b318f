//! A variant's TTL (`ttl: 30s`): humantime text, whole milliseconds, within bounds. Clients
//! drop a TTL'd resource when the TTL runs out without a heartbeat or an update, so a TTL too
//! short for heartbeats to keep up with, or so long that it never matters, is refused.

use std::time::Duration;

/// The shortest TTL: heartbeats go out at a fraction of it, and a round trip must fit.
pub const MIN_TTL: Duration = Duration::from_secs(1);
/// The longest TTL: a day; longer is no safety net.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Parses and checks a variant's `ttl`; the error is the problem's message.
pub(super) fn parse(text: &str) -> Result<Duration, String> {
    let ttl = humantime::parse_duration(text.trim())
        .map_err(|e| format!("ttl {text:?} is not a duration such as \"30s\": {e}"))?;
    if ttl.subsec_nanos() % 1_000_000 != 0 {
        return Err(format!(
            "ttl {text:?} is not a whole number of milliseconds"
        ));
    }
    if ttl < MIN_TTL || ttl > MAX_TTL {
        return Err(format!(
            "ttl {text:?} is outside {} to {}",
            humantime::format_duration(MIN_TTL),
            humantime::format_duration(MAX_TTL)
        ));
    }
    Ok(ttl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_and_syntax() {
        assert_eq!(parse("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse("1500ms").unwrap(), Duration::from_millis(1500));
        for bad in ["0s", "500ms", "2days", "soon", "", "1s 1us"] {
            assert!(parse(bad).unwrap_err().contains("ttl"), "{bad}");
        }
    }
}
