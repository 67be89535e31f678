//! Wall-clock time as the specs use it: Unix time, kept in nanoseconds.
//! One type, so that seconds and milliseconds are derived in one place
//! instead of by division at each call site.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

const NANOS_PER_SEC: i64 = 1_000_000_000;
const NANOS_PER_MILLI: i64 = 1_000_000;

/// An instant of wall-clock time: nanoseconds since the Unix epoch, as the
/// stores keep it (a server timestamp, a renewal time). Before the epoch is
/// negative; every conversion rounds down.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Timestamp(i64);

impl Timestamp {
    pub const UNIX_EPOCH: Self = Self(0);

    /// Now, by the system clock; the epoch when the clock is before it, the
    /// largest timestamp when it is past year 2262.
    pub fn now() -> Self {
        Self::from_system_time(SystemTime::now())
    }

    pub fn from_system_time(time: SystemTime) -> Self {
        match time.duration_since(UNIX_EPOCH) {
            Ok(since) => Self(i64::try_from(since.as_nanos()).unwrap_or(i64::MAX)),
            Err(_) => Self::UNIX_EPOCH,
        }
    }

    /// As stored: nanoseconds since the epoch.
    pub const fn from_unix_nanos(nanos: i64) -> Self {
        Self(nanos)
    }

    pub const fn as_unix_nanos(self) -> i64 {
        self.0
    }

    /// Whole seconds since the epoch, rounded down.
    pub const fn as_secs(self) -> i64 {
        self.0.div_euclid(NANOS_PER_SEC)
    }

    /// Whole milliseconds since the epoch, rounded down.
    pub const fn as_millis(self) -> i64 {
        self.0.div_euclid(NANOS_PER_MILLI)
    }

    /// `None` past the largest timestamp.
    pub fn checked_add(self, d: Duration) -> Option<Self> {
        i64::try_from(d.as_nanos()).ok().and_then(|n| self.0.checked_add(n)).map(Self)
    }

    /// `None` before the smallest timestamp.
    pub fn checked_sub(self, d: Duration) -> Option<Self> {
        i64::try_from(d.as_nanos()).ok().and_then(|n| self.0.checked_sub(n)).map(Self)
    }

    /// Clamped at the largest timestamp: e.g. an expiry after a very long ttl.
    pub fn saturating_add(self, d: Duration) -> Self {
        self.checked_add(d).unwrap_or(Self(i64::MAX))
    }

    /// Clamped at the smallest timestamp: e.g. a cutoff a very long ttl ago.
    pub fn saturating_sub(self, d: Duration) -> Self {
        self.checked_sub(d).unwrap_or(Self(i64::MIN))
    }

    /// How long after `earlier` this is; zero when it is not after it.
    pub fn saturating_duration_since(self, earlier: Self) -> Duration {
        u64::try_from(self.0.saturating_sub(earlier.0)).map_or(Duration::ZERO, Duration::from_nanos)
    }
}

/// The time rules run on: the system clock in production, a controlled one
/// in tests. `Engine::start` takes one and hands it to every role.
pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;

    /// Now in Unix ms.
    fn now_ms(&self) -> i64 {
        self.now().as_millis()
    }
}

/// The wall clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_round_down() {
        let t = Timestamp::from_unix_nanos(1_700_000_000_999_999_999);
        assert_eq!((t.as_secs(), t.as_millis()), (1_700_000_000, 1_700_000_000_999));
        let before = Timestamp::from_unix_nanos(-1);
        assert_eq!((before.as_secs(), before.as_millis()), (-1, -1));
        assert_eq!(Timestamp::from_system_time(UNIX_EPOCH + Duration::from_millis(1500)).as_millis(), 1500);
        assert_eq!(Timestamp::from_system_time(UNIX_EPOCH - Duration::from_secs(1)), Timestamp::UNIX_EPOCH);
    }

    #[test]
    fn arithmetic_is_checked_or_clamped() {
        let t = Timestamp::from_unix_nanos(10);
        assert_eq!(t.checked_add(Duration::from_nanos(5)), Some(Timestamp::from_unix_nanos(15)));
        assert_eq!(t.checked_sub(Duration::from_nanos(15)), Some(Timestamp::from_unix_nanos(-5)));
        assert_eq!(Timestamp::from_unix_nanos(i64::MAX).checked_add(Duration::from_nanos(1)), None);
        assert_eq!(t.checked_add(Duration::MAX), None);
        assert_eq!(t.saturating_add(Duration::MAX).as_unix_nanos(), i64::MAX);
        assert_eq!(t.saturating_sub(Duration::MAX).as_unix_nanos(), i64::MIN);
        assert_eq!(t.saturating_duration_since(Timestamp::UNIX_EPOCH), Duration::from_nanos(10));
        assert_eq!(Timestamp::UNIX_EPOCH.saturating_duration_since(t), Duration::ZERO);
    }
}
