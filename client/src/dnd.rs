//! Spec 002 §7: the do-not-disturb schedule (`ak.schema.dnd_schedule.v1`).
//! A closed schema with semantic checks, evaluated at an instant in the
//! declared zone with IANA tzdb 2025b exactly; an invalid new value keeps
//! the last valid one.
//!
//! The zone data is chrono-tz 0.10.4's, which bundles tzdb 2025b (pinned
//! with `=` in the workspace, checked by [`check_tzdb`] and a test). A zone
//! name must be canonical, a `Zone` of 2025b: the list in
//! `data/tzdb-2025b-zones.txt` was taken from the 2025b sources chrono-tz
//! ships; links such as `Asia/Chongqing` or `US/Eastern` are refused.
//!
//! Phones report the zone their OS database names, often a 2025b link
//! (`Europe/Kiev`, `Asia/Kuala_Lumpur`, `Europe/Amsterdam`): an app turns
//! it into the canonical name with [`canonical_zone_name`] before it writes
//! a schedule, so the value it stores is one every reader accepts.

use std::collections::BTreeSet;
use std::str::FromStr;

use chrono::{DateTime, TimeZone, Timelike, Utc};
use chrono_tz::Tz;
use serde::Deserialize;

use crate::push_rules::{Decision, EventContext, RuleSet, evaluate};

/// v1 fixes the tzdb version (§7).
pub const TZDB_VERSION: &str = "2025b";

const ZONES: &str = include_str!("../data/tzdb-2025b-zones.txt");
/// The 2025b `Link` lines, `alias<TAB>canonical`.
const LINKS: &str = include_str!("../data/tzdb-2025b-links.txt");

const MINUTES_PER_DAY: u16 = 24 * 60;

/// Why a schedule value is invalid (each is a fixable error for the user).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DndErrorCode {
    /// Not the closed shape: a missing, unknown or mistyped field.
    SchemaViolation,
    /// Not a canonical IANA zone name of tzdb 2025b (alias, abbreviation,
    /// wrong case, `local`).
    InvalidTimezone,
    /// tzdb_version is not 2025b, or this build's data is not.
    TzdbMismatch,
    /// A time that is not zero-padded `HH:MM` within the day.
    InvalidTime,
    /// A period whose start equals its end.
    EmptyPeriod,
    /// all_day with periods.
    AllDayWithPeriods,
    /// Periods not strictly ascending, or overlapping or adjacent.
    NonCanonicalPeriods,
    /// Exceptions not in code-point order or repeated.
    NonCanonicalExceptions,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {detail}")]
pub struct DndError {
    pub code: DndErrorCode,
    pub detail: String,
}

fn error(code: DndErrorCode, detail: impl Into<String>) -> DndError {
    DndError { code, detail: detail.into() }
}

/// Whether this build's zone data is the pinned release.
pub fn check_tzdb() -> Result<(), DndError> {
    if chrono_tz::IANA_TZDB_VERSION != TZDB_VERSION {
        return Err(error(
            DndErrorCode::TzdbMismatch,
            format!("this build bundles tzdb {}, v1 needs {TZDB_VERSION}", chrono_tz::IANA_TZDB_VERSION),
        ));
    }
    Ok(())
}

/// The zone named exactly `name`, when it is a canonical 2025b zone.
pub fn canonical_zone(name: &str) -> Option<Tz> {
    let listed = ZONES.lines().any(|l| !l.starts_with('#') && l == name);
    // chrono-tz parses case-sensitively (its case-insensitive feature is off).
    if listed { Tz::from_str(name).ok() } else { None }
}

/// The canonical tzdb 2025b name of a zone name a device reports: the name
/// itself when it is canonical, the zone it links to when it is a 2025b
/// alias (`Europe/Kiev` → `Europe/Kyiv`, `Asia/Kuala_Lumpur` →
/// `Asia/Singapore`, `Europe/Amsterdam` → `Europe/Brussels`, `UTC` →
/// `Etc/UTC`), else `None` (unknown names, abbreviations such as `CST`,
/// `local`, wrong case). For writing a schedule only: a schedule read with
/// [`Dnd::parse`] must still name the canonical zone (§7 refuses aliases).
pub fn canonical_zone_name(reported: &str) -> Option<&'static str> {
    let canonical = ZONES.lines().find(|l| !l.starts_with('#') && *l == reported);
    canonical.or_else(|| {
        LINKS
            .lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| l.split_once('\t').filter(|(alias, _)| *alias == reported).map(|(_, zone)| zone))
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Root {
    dnd: DndWire,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DndWire {
    enabled: bool,
    schedule: ScheduleWire,
    exceptions: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleWire {
    timezone: String,
    tzdb_version: String,
    all_day: bool,
    periods: Vec<PeriodWire>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PeriodWire {
    start: String,
    end: String,
}

/// A half-open recurring period of wall-clock minutes, [start, end); when
/// start > end it crosses midnight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Period {
    pub start: u16,
    pub end: u16,
}

impl Period {
    pub fn contains(self, minute: u16) -> bool {
        if self.start < self.end {
            (self.start..self.end).contains(&minute)
        } else {
            minute >= self.start || minute < self.end
        }
    }
}

/// A validated DND value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dnd {
    pub enabled: bool,
    pub timezone: Tz,
    pub all_day: bool,
    pub periods: Vec<Period>,
    pub exceptions: Vec<String>,
}

fn minute_of(text: &str) -> Result<u16, DndError> {
    let bad = || error(DndErrorCode::InvalidTime, format!("{text:?} is not zero-padded HH:MM"));
    let b = text.as_bytes();
    if b.len() != 5 || b[2] != b':' || ![0, 1, 3, 4].iter().all(|&i| b[i].is_ascii_digit()) {
        return Err(bad());
    }
    let digit = |i: usize| u16::from(b[i] - b'0');
    let (h, m) = (digit(0) * 10 + digit(1), digit(3) * 10 + digit(4));
    if h > 23 || m > 59 {
        return Err(bad());
    }
    Ok(h * 60 + m)
}

impl Dnd {
    /// Parses and validates a decrypted `ak.dnd_schedule` plaintext.
    pub fn parse(json: &[u8]) -> Result<Dnd, DndError> {
        check_tzdb()?;
        let root: Root =
            serde_json::from_slice(json).map_err(|e| error(DndErrorCode::SchemaViolation, e.to_string()))?;
        let DndWire { enabled, schedule, exceptions } = root.dnd;
        if schedule.tzdb_version != TZDB_VERSION {
            return Err(error(
                DndErrorCode::TzdbMismatch,
                format!("tzdb_version {:?} is not {TZDB_VERSION}", schedule.tzdb_version),
            ));
        }
        let timezone = canonical_zone(&schedule.timezone).ok_or_else(|| {
            error(DndErrorCode::InvalidTimezone, format!("{:?} is not a canonical IANA zone name", schedule.timezone))
        })?;
        if schedule.all_day && !schedule.periods.is_empty() {
            return Err(error(DndErrorCode::AllDayWithPeriods, "all-day quiet is all_day=true with periods=[]"));
        }
        let mut periods = Vec::with_capacity(schedule.periods.len());
        for p in &schedule.periods {
            let period = Period { start: minute_of(&p.start)?, end: minute_of(&p.end)? };
            if period.start == period.end {
                return Err(error(DndErrorCode::EmptyPeriod, format!("{}–{} starts where it ends", p.start, p.end)));
            }
            periods.push(period);
        }
        check_canonical(&periods)?;
        if exceptions.windows(2).any(|w| w[0] >= w[1]) {
            // String order is code-point order in Rust.
            return Err(error(DndErrorCode::NonCanonicalExceptions, "exceptions must be sorted and unique"));
        }
        Ok(Dnd { enabled, timezone, all_day: schedule.all_day, periods, exceptions })
    }

    /// Whether `at` falls in quiet time: the instant as a wall-clock minute
    /// of the zone, tested against each period. A minute skipped by a DST gap
    /// is never a wall-clock minute of any instant, so it never triggers; a
    /// minute repeated by a fold is the same minute both times.
    pub fn quiet_at(&self, at: DateTime<Utc>) -> bool {
        if !self.enabled {
            return false;
        }
        if self.all_day {
            return true;
        }
        let local = self.timezone.from_utc_datetime(&at.naive_utc());
        let minute = (local.hour() * 60 + local.minute()) as u16;
        self.periods.iter().any(|p| p.contains(minute))
    }

    /// Whether a notification decided by rule `rule_id` may go out at `at`:
    /// outside quiet time always; inside only for an exception equal to the
    /// final matched rule_id.
    pub fn allows(&self, rule_id: Option<&str>, at: DateTime<Utc>) -> bool {
        !self.quiet_at(at) || rule_id.is_some_and(|id| self.exceptions.binary_search_by(|e| e.as_str().cmp(id)).is_ok())
    }
}

/// §7: strictly ascending starts, no two periods overlapping or adjacent
/// (a producer merges them first; a consumer never normalises).
fn check_canonical(periods: &[Period]) -> Result<(), DndError> {
    let bad = |detail: &str| Err(error(DndErrorCode::NonCanonicalPeriods, detail));
    if periods.windows(2).any(|w| w[0].start >= w[1].start) {
        return bad("periods must be in strictly ascending order of start");
    }
    let mut taken = vec![false; MINUTES_PER_DAY as usize];
    for p in periods {
        for m in (0..MINUTES_PER_DAY).filter(|&m| p.contains(m)) {
            if std::mem::replace(&mut taken[m as usize], true) {
                return bad("periods overlap");
            }
        }
    }
    let starts: BTreeSet<u16> = periods.iter().map(|p| p.start).collect();
    if periods.iter().any(|p| starts.contains(&(p.end % MINUTES_PER_DAY))) {
        return bad("periods are adjacent: merge them");
    }
    Ok(())
}

/// The DND setting a client holds: the last valid value, and the error of a
/// newer invalid one for the user to fix (§7).
#[derive(Clone, Debug, Default)]
pub struct DndSetting {
    current: Option<Dnd>,
    last_error: Option<DndError>,
}

impl DndSetting {
    /// Takes a new value: valid, it replaces the current one; invalid, the
    /// last valid value stays in force and the error is kept for the user.
    pub fn update(&mut self, json: &[u8]) -> Result<(), DndError> {
        match Dnd::parse(json) {
            Ok(dnd) => {
                self.current = Some(dnd);
                self.last_error = None;
                Ok(())
            }
            Err(e) => {
                self.last_error = Some(e.clone());
                Err(e)
            }
        }
    }

    /// The value in force; `None` (no DND) when none was ever valid.
    pub fn current(&self) -> Option<&Dnd> {
        self.current.as_ref()
    }

    pub fn last_error(&self) -> Option<&DndError> {
        self.last_error.as_ref()
    }

    pub fn allows(&self, rule_id: Option<&str>, at: DateTime<Utc>) -> bool {
        self.current.as_ref().is_none_or(|d| d.allows(rule_id, at))
    }
}

/// The device's final decision for an event: the rule chain's first match
/// (§4), then DND (§7): in quiet time only a rule listed in the exceptions
/// notifies.
pub fn decide(rules: &RuleSet, dnd: &DndSetting, event: &EventContext, at: DateTime<Utc>) -> Decision {
    let mut decision = evaluate(rules, event);
    if decision.notify && !dnd.allows(decision.rule_id.as_deref(), at) {
        decision.notify = false;
        decision.quieted = true;
    }
    decision
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().with_timezone(&Utc)
    }

    fn value(zone: &str, all_day: bool, periods: &[(&str, &str)], exceptions: &[&str]) -> String {
        let periods: Vec<String> = periods.iter().map(|(s, e)| format!(r#"{{"start":"{s}","end":"{e}"}}"#)).collect();
        let exceptions: Vec<String> = exceptions.iter().map(|e| format!("{e:?}")).collect();
        format!(
            r#"{{"dnd":{{"enabled":true,"schedule":{{"timezone":"{zone}","tzdb_version":"2025b","all_day":{all_day},"periods":[{}]}},"exceptions":[{}]}}}}"#,
            periods.join(","),
            exceptions.join(",")
        )
    }

    fn parse(zone: &str, periods: &[(&str, &str)]) -> Result<Dnd, DndError> {
        Dnd::parse(value(zone, false, periods, &[]).as_bytes())
    }

    fn code(r: Result<Dnd, DndError>) -> DndErrorCode {
        r.unwrap_err().code
    }

    #[test]
    fn the_bundled_tzdb_is_exactly_2025b() {
        assert_eq!(chrono_tz::IANA_TZDB_VERSION, "2025b");
        assert!(check_tzdb().is_ok());
    }

    #[test]
    fn every_listed_zone_exists_in_the_bundled_data() {
        let zones: Vec<&str> = ZONES.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(zones.len(), 340);
        for z in zones {
            assert!(canonical_zone(z).is_some(), "{z}");
        }
    }

    #[test]
    fn the_spec_example_asia_shanghai_22_to_08() {
        let spec = r#"{"dnd":{"enabled":true,"schedule":{"timezone":"Asia/Shanghai","tzdb_version":"2025b",
            "all_day":false,"periods":[{"start":"22:00","end":"08:00"}]},"exceptions":["content.keyword-urgent"]}}"#;
        let dnd = Dnd::parse(spec.as_bytes()).unwrap();
        assert!(!dnd.quiet_at(at("2025-06-01T13:59:00Z")));
        assert!(dnd.quiet_at(at("2025-06-01T14:00:00Z")));
        assert!(dnd.quiet_at(at("2025-06-01T23:59:00Z")));
        assert!(!dnd.quiet_at(at("2025-06-02T00:00:00Z")));
        // Only the exception's rule gets through in quiet time.
        let night = at("2025-06-01T15:00:00Z");
        assert!(dnd.allows(Some("content.keyword-urgent"), night));
        assert!(!dnd.allows(Some("underride.dm"), night));
        assert!(!dnd.allows(Some("content.keyword"), night), "exact rule_id only");
        assert!(!dnd.allows(None, night));
        assert!(dnd.allows(Some("underride.dm"), at("2025-06-01T04:00:00Z")));
    }

    #[test]
    fn new_york_spring_forward_gap_minutes_never_trigger() {
        // 2025-03-09: 02:00–02:59 local do not exist.
        let gap = parse("America/New_York", &[("02:00", "03:00")]).unwrap();
        assert!(!gap.quiet_at(at("2025-03-09T06:59:00Z")), "01:59 EST");
        assert!(!gap.quiet_at(at("2025-03-09T07:00:00Z")), "03:00 EDT: the period's minutes were skipped");
        assert!(gap.quiet_at(at("2025-03-10T06:30:00Z")), "02:30 EDT the next day");
        let inside = parse("America/New_York", &[("02:15", "02:45")]).unwrap();
        let day = (0..24 * 60).map(|m| at("2025-03-09T05:00:00Z") + chrono::Duration::minutes(m));
        assert_eq!(day.filter(|&t| inside.quiet_at(t)).count(), 0, "no instant of that day is in 02:15–02:45");
    }

    #[test]
    fn new_york_fall_back_fold_minutes_evaluate_the_same_both_times() {
        // 2025-11-02: 01:00–01:59 local happen twice (EDT, then EST).
        let fold = parse("America/New_York", &[("01:00", "02:00")]).unwrap();
        assert!(fold.quiet_at(at("2025-11-02T05:30:00Z")), "01:30 EDT");
        assert!(fold.quiet_at(at("2025-11-02T06:30:00Z")), "01:30 EST");
        assert!(!fold.quiet_at(at("2025-11-02T07:00:00Z")), "02:00 EST");
        let after = parse("America/New_York", &[("01:30", "01:45")]).unwrap();
        assert_eq!(after.quiet_at(at("2025-11-02T05:35:00Z")), after.quiet_at(at("2025-11-02T06:35:00Z")));
        assert!(after.quiet_at(at("2025-11-02T05:35:00Z")));
    }

    #[test]
    fn zone_names_must_be_canonical_and_exact() {
        assert!(parse("Asia/Shanghai", &[("22:00", "08:00")]).is_ok());
        for bad in ["asia/shanghai", "Asia/Chongqing", "US/Eastern", "UTC", "GMT", "EST", "CST", "local", "PRC", ""] {
            assert_eq!(code(parse(bad, &[("22:00", "08:00")])), DndErrorCode::InvalidTimezone, "{bad}");
        }
        assert!(parse("Etc/UTC", &[("22:00", "08:00")]).is_ok());
    }

    #[test]
    fn reported_aliases_map_to_their_canonical_zone() {
        assert_eq!(canonical_zone_name("Europe/Kiev"), Some("Europe/Kyiv"));
        assert_eq!(canonical_zone_name("Asia/Kuala_Lumpur"), Some("Asia/Singapore"));
        assert_eq!(canonical_zone_name("Europe/Amsterdam"), Some("Europe/Brussels"));
        assert_eq!(canonical_zone_name("Asia/Calcutta"), Some("Asia/Kolkata"));
        assert_eq!(canonical_zone_name("US/Eastern"), Some("America/New_York"));
        assert_eq!(canonical_zone_name("UTC"), Some("Etc/UTC"));
        assert_eq!(canonical_zone_name("Asia/Shanghai"), Some("Asia/Shanghai"), "canonical stays");
        for unknown in ["europe/kiev", "CST", "local", "Mars/Olympus", "", "Europe/Kiev\tEurope/Kyiv"] {
            assert_eq!(canonical_zone_name(unknown), None, "{unknown:?}");
        }
        // The mapped name is what a schedule must carry; the alias is still refused.
        assert!(parse(canonical_zone_name("Europe/Kiev").unwrap(), &[("22:00", "08:00")]).is_ok());
        assert_eq!(code(parse("Europe/Kiev", &[("22:00", "08:00")])), DndErrorCode::InvalidTimezone);
    }

    #[test]
    fn every_2025b_link_names_a_canonical_zone_with_the_same_offsets() {
        let links: Vec<(&str, &str)> =
            LINKS.lines().filter(|l| !l.starts_with('#')).map(|l| l.split_once('\t').unwrap()).collect();
        assert_eq!(links.len(), 257);
        // Every bundled name is either a listed zone or a listed link.
        assert_eq!(chrono_tz::TZ_VARIANTS.len(), 340 + links.len());
        let instants = ["2000-01-01T00:00:00Z", "2025-01-15T12:00:00Z", "2025-07-15T12:00:00Z"].map(at);
        for (alias, zone) in links {
            assert!(canonical_zone(alias).is_none(), "{alias} is not canonical");
            assert_eq!(canonical_zone_name(alias), Some(zone));
            let (a, z) = (Tz::from_str(alias).unwrap(), canonical_zone(zone).expect(zone));
            for t in instants {
                let offset = |tz: Tz| tz.from_utc_datetime(&t.naive_utc()).naive_local();
                assert_eq!(offset(a), offset(z), "{alias} and {zone} at {t}");
            }
        }
    }

    #[test]
    fn the_tzdb_version_must_be_2025b() {
        let v = value("Asia/Shanghai", false, &[("22:00", "08:00")], &[]).replace("2025b", "2025a");
        assert_eq!(Dnd::parse(v.as_bytes()).unwrap_err().code, DndErrorCode::TzdbMismatch);
    }

    #[test]
    fn times_are_zero_padded_hh_mm() {
        for bad in ["8:00", "24:00", "23:60", "0800", "08:0", " 8:00", "08:00:00", "ab:cd"] {
            assert_eq!(code(parse("Asia/Shanghai", &[(bad, "09:00")])), DndErrorCode::InvalidTime, "{bad}");
        }
        assert_eq!(code(parse("Asia/Shanghai", &[("08:00", "08:00")])), DndErrorCode::EmptyPeriod);
        let edges = parse("Asia/Shanghai", &[("00:00", "23:59")]).unwrap();
        assert_eq!(edges.periods, vec![Period { start: 0, end: 23 * 60 + 59 }]);
    }

    #[test]
    fn all_day_is_only_all_day_true_with_no_periods() {
        let all = Dnd::parse(value("Asia/Shanghai", true, &[], &[]).as_bytes()).unwrap();
        assert!(all.quiet_at(at("2025-06-01T04:00:00Z")));
        let both = Dnd::parse(value("Asia/Shanghai", true, &[("22:00", "08:00")], &[]).as_bytes());
        assert_eq!(code(both), DndErrorCode::AllDayWithPeriods);
        let never = Dnd::parse(value("Asia/Shanghai", false, &[], &[]).as_bytes()).unwrap();
        assert!(!never.quiet_at(at("2025-06-01T04:00:00Z")));
    }

    #[test]
    fn period_lists_must_be_canonical() {
        let ok = parse("Asia/Shanghai", &[("01:00", "03:00"), ("12:00", "13:00"), ("22:00", "00:30")]).unwrap();
        assert_eq!(ok.periods.len(), 3);
        for periods in [
            &[("12:00", "13:00"), ("01:00", "03:00")][..], // descending
            &[("01:00", "03:00"), ("01:00", "02:00")][..], // same start
            &[("01:00", "03:00"), ("02:00", "04:00")][..], // overlap
            &[("01:00", "03:00"), ("03:00", "04:00")][..], // adjacent
            &[("01:00", "03:00"), ("22:00", "01:00")][..], // adjacent across midnight
            &[("01:00", "03:00"), ("22:00", "01:30")][..], // overlap across midnight
            &[("02:00", "01:00"), ("05:00", "06:00")][..], // a wrap swallowing the rest
        ] {
            assert_eq!(code(parse("Asia/Shanghai", periods)), DndErrorCode::NonCanonicalPeriods, "{periods:?}");
        }
    }

    #[test]
    fn exceptions_are_sorted_by_code_point_and_unique() {
        let v = |e: &[&str]| Dnd::parse(value("Asia/Shanghai", false, &[("22:00", "08:00")], e).as_bytes());
        assert!(v(&["a", "b"]).is_ok());
        assert!(v(&["Z", "a"]).is_ok(), "code-point order puts upper case first");
        assert_eq!(code(v(&["b", "a"])), DndErrorCode::NonCanonicalExceptions);
        assert_eq!(code(v(&["a", "a"])), DndErrorCode::NonCanonicalExceptions);
    }

    #[test]
    fn the_schema_is_closed() {
        let good = value("Asia/Shanghai", false, &[("22:00", "08:00")], &[]);
        let inner = good.strip_prefix(r#"{"dnd":"#).unwrap().strip_suffix('}').unwrap();
        for bad in [
            inner.to_string(),                                              // the inner object as root
            good.replace(r#""enabled":true,"#, ""),                         // missing field
            good.replace(r#""all_day":false,"#, ""),                        // missing schedule field
            good.replace(r#""exceptions":[]"#, r#""exceptions":[],"x":1"#), // unknown field
            good.replace(r#"{"dnd":"#, r#"{"v":1,"dnd":"#),                 // unknown root field
            good.replace(r#""end":"08:00""#, r#""end":"08:00","note":"x""#),
            good.replace(r#""enabled":true"#, r#""enabled":"yes""#),
        ] {
            assert_eq!(Dnd::parse(bad.as_bytes()).unwrap_err().code, DndErrorCode::SchemaViolation, "{bad}");
        }
    }

    #[test]
    fn an_invalid_new_value_keeps_the_last_valid_one() {
        let mut setting = DndSetting::default();
        let night = at("2025-06-01T15:00:00Z");
        // Never valid: no DND.
        assert!(setting.update(b"{\"dnd\":{}}").is_err());
        assert!(setting.current().is_none());
        assert!(setting.allows(None, night));

        setting.update(value("Asia/Shanghai", false, &[("22:00", "08:00")], &[]).as_bytes()).unwrap();
        assert!(!setting.allows(None, night));
        let broken = value("Asia/Shanghai", false, &[("22:00", "08:00")], &[]).replace("2025b", "2026a");
        assert_eq!(setting.update(broken.as_bytes()).unwrap_err().code, DndErrorCode::TzdbMismatch);
        assert!(!setting.allows(None, night), "the last valid value stays in force");
        assert_eq!(setting.last_error().map(|e| e.code), Some(DndErrorCode::TzdbMismatch));
        setting.update(value("Asia/Shanghai", false, &[("01:00", "02:00")], &[]).as_bytes()).unwrap();
        assert!(setting.allows(None, night));
        assert!(setting.last_error().is_none());
    }

    #[test]
    fn the_chain_then_dnd_lets_only_the_exception_through_at_night() {
        let rules = RuleSet::parse(crate::push_rules::tests::SPEC_EXAMPLE.as_bytes()).unwrap();
        let mut dnd = DndSetting::default();
        dnd.update(value("Asia/Shanghai", false, &[("22:00", "08:00")], &["content.keyword-urgent"]).as_bytes())
            .unwrap();
        let event = |body: &str| EventContext {
            body: Some(body.into()),
            mentions_actor: Some(true),
            is_direct_message: Some(false),
            ..EventContext::default()
        };
        let night = at("2025-06-01T15:00:00Z");
        let urgent = decide(&rules, &dnd, &event("P0 outage"), night);
        assert!(urgent.notify && !urgent.quieted);
        let mention = decide(&rules, &dnd, &event("lunch?"), night);
        assert_eq!(
            (mention.rule_id.as_deref(), mention.notify, mention.quieted),
            (Some("underride.mention"), false, true)
        );
        let day = decide(&rules, &dnd, &event("lunch?"), at("2025-06-01T04:00:00Z"));
        assert!(day.notify && !day.quieted);
    }

    #[test]
    fn a_disabled_schedule_is_never_quiet() {
        let v = value("Asia/Shanghai", true, &[], &[]).replace(r#""enabled":true"#, r#""enabled":false"#);
        assert!(!Dnd::parse(v.as_bytes()).unwrap().quiet_at(at("2025-06-01T15:00:00Z")));
    }
}
