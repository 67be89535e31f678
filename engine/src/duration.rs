//! The `*_seconds` and `*_ms` keys as `Duration`s, for
//! `#[serde(deserialize_with = ...)]`. The keys keep their names and their
//! whole-number form; the unit is in the name. Every such key is a period or a
//! bound that must elapse, so zero is refused.

use std::time::Duration;

use serde::de::{Deserialize, Deserializer, Error, Unexpected};

/// A positive whole number of seconds, e.g. `window_timeout_seconds = 120`.
pub fn seconds<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    positive(deserializer, "a positive number of seconds").map(Duration::from_secs)
}

/// A positive whole number of milliseconds, e.g. `poll_interval_ms = 1000`.
pub fn millis<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    positive(deserializer, "a positive number of milliseconds").map(Duration::from_millis)
}

fn positive<'de, D: Deserializer<'de>>(deserializer: D, expected: &'static str) -> Result<u64, D::Error> {
    match u64::deserialize(deserializer)? {
        0 => Err(D::Error::invalid_value(Unexpected::Unsigned(0), &expected)),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct Keys {
        #[serde(deserialize_with = "seconds")]
        timeout_seconds: Duration,
        #[serde(deserialize_with = "millis")]
        interval_ms: Duration,
    }

    fn parse(json: serde_json::Value) -> Result<Keys, String> {
        serde_json::from_value(json).map_err(|e| e.to_string())
    }

    #[test]
    fn durations_parse_from_whole_numbers_in_the_unit_of_their_name() {
        let k = parse(serde_json::json!({"timeout_seconds": 120, "interval_ms": 1000})).unwrap();
        assert_eq!((k.timeout_seconds, k.interval_ms), (Duration::from_secs(120), Duration::from_secs(1)));
    }

    #[test]
    fn zero_negative_and_fractions_are_refused() {
        let err = parse(serde_json::json!({"timeout_seconds": 0, "interval_ms": 1})).unwrap_err();
        assert!(err.contains("expected a positive number of seconds"), "{err}");
        let err = parse(serde_json::json!({"timeout_seconds": 1, "interval_ms": 0})).unwrap_err();
        assert!(err.contains("expected a positive number of milliseconds"), "{err}");
        assert!(parse(serde_json::json!({"timeout_seconds": -1, "interval_ms": 1})).is_err());
        assert!(parse(serde_json::json!({"timeout_seconds": 1.5, "interval_ms": 1})).is_err());
    }
}
