//! Wall-clock time as the specs use it: Unix time in nanoseconds.

use std::time::{SystemTime, UNIX_EPOCH};

pub fn unix_now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}
