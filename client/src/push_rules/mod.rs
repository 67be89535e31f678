//! Spec 002 §4: the user's push rule chain, evaluated on the device after it
//! decrypted an event. Parsing validates at save time (a rule set that
//! parses is one the evaluator can run); evaluation is pure.
//!
//! Readings of the spec this module pins (documented in docs/CLIENT.md):
//! - `evaluation_locus` may be omitted (the §4.1 example omits it) and then
//!   means `client`; `server` is `unsupported_feature` (§4.3).
//! - `member_count` is `{"kind":"member_count","op":"<=","value":10}` with op
//!   one of `==`, `<`, `<=`, `>`, `>=`; see [`member_count`].
//! - `contains_keyword`'s pattern is `|`-separated alternatives, each matched
//!   case-insensitively as a substring of the body.
//! - `field_match`, `strand_track` and `watch_state` patterns are globs (`*`,
//!   `?`), case-sensitive; the latter two also take a list of globs.

pub mod evaluate;
pub mod member_count;
pub mod pattern;

use std::collections::BTreeSet;

use serde::Deserialize;

pub use evaluate::{Decision, EventContext, evaluate};
pub use member_count::{BucketGrid, MemberCount, MemberCountPredicate};

/// Why a rule set was refused at save.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleErrorCode {
    /// The JSON does not have the closed shape: unknown or missing field,
    /// wrong type, unknown kind, condition or action.
    SchemaViolation,
    /// Well formed, but a value is not allowed (empty pattern, duplicate
    /// rule_id, contradictory actions, a member_count split bucket).
    ParamInvalid,
    /// `evaluation_locus: "server"`, reserved for a future profile (§4.3).
    UnsupportedFeature,
}

impl RuleErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            RuleErrorCode::SchemaViolation => "schema_violation",
            RuleErrorCode::ParamInvalid => "param_invalid",
            RuleErrorCode::UnsupportedFeature => "unsupported_feature",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {detail}", code.as_str())]
pub struct RuleError {
    pub code: RuleErrorCode,
    /// The rule at fault, when one is.
    pub rule_id: Option<String>,
    pub detail: String,
}

impl RuleError {
    fn new(code: RuleErrorCode, rule_id: Option<&str>, detail: impl Into<String>) -> RuleError {
        RuleError { code, rule_id: rule_id.map(str::to_owned), detail: detail.into() }
    }
}

/// §4.2: the kind orders the chain: override before content before underride.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleKind {
    Override,
    Content,
    Underride,
}

/// §4.4.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Notify,
    DontNotify,
    SoundDefault,
    SoundCritical,
    Highlight,
}

/// One glob or a list of globs.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
enum Patterns {
    One(String),
    Many(Vec<String>),
}

impl Patterns {
    fn into_vec(self) -> Vec<String> {
        match self {
            Patterns::One(p) => vec![p],
            Patterns::Many(v) => v,
        }
    }
}

/// §4.3, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum ConditionWire {
    FieldMatch { field: String, pattern: String },
    ContainsKeyword { pattern: String },
    // Struct variants: a unit variant of an internally tagged enum would
    // let unknown fields through.
    MentionsActor {},
    IsDirectMessage {},
    MemberCount { op: String, value: u64 },
    StrandTrack { pattern: Patterns },
    WatchState { pattern: Patterns },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleWire {
    rule_id: String,
    kind: RuleKind,
    enabled: bool,
    evaluation_locus: Option<String>,
    conditions: Vec<ConditionWire>,
    actions: Vec<Action>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleSetWire {
    rules: Vec<RuleWire>,
}

/// A validated condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Condition {
    FieldMatch {
        field: String,
        pattern: String,
    },
    /// Alternatives, already lowercased.
    ContainsKeyword {
        alternatives: Vec<String>,
    },
    MentionsActor,
    IsDirectMessage,
    MemberCount(MemberCountPredicate),
    StrandTrack {
        patterns: Vec<String>,
    },
    WatchState {
        patterns: Vec<String>,
    },
}

/// A validated rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub rule_id: String,
    pub kind: RuleKind,
    pub enabled: bool,
    pub conditions: Vec<Condition>,
    pub actions: Vec<Action>,
}

/// A validated chain, in evaluation order (kind order, then stored order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleSet {
    rules: Vec<Rule>,
}

impl RuleSet {
    /// Parses and validates `{"rules": [...]}` against the default member
    /// count grid.
    pub fn parse(json: &[u8]) -> Result<RuleSet, RuleError> {
        RuleSet::parse_with_grid(json, &BucketGrid::default())
    }

    /// As [`parse`](Self::parse), with the Realm's member-count grid.
    pub fn parse_with_grid(json: &[u8], grid: &BucketGrid) -> Result<RuleSet, RuleError> {
        let wire: RuleSetWire = serde_json::from_slice(json)
            .map_err(|e| RuleError::new(RuleErrorCode::SchemaViolation, None, e.to_string()))?;
        let mut seen = BTreeSet::new();
        let mut rules = Vec::with_capacity(wire.rules.len());
        for rule in wire.rules {
            let rule = validate(rule, grid)?;
            if !seen.insert(rule.rule_id.clone()) {
                return Err(RuleError::new(RuleErrorCode::ParamInvalid, Some(&rule.rule_id), "duplicate rule_id"));
            }
            rules.push(rule);
        }
        // Stable: within a kind the stored order holds.
        rules.sort_by_key(|r| r.kind);
        Ok(RuleSet { rules })
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }
}

fn validate(wire: RuleWire, grid: &BucketGrid) -> Result<Rule, RuleError> {
    let id = wire.rule_id.as_str();
    let invalid = |detail: &str| RuleError::new(RuleErrorCode::ParamInvalid, Some(id), detail);
    if id.is_empty() {
        return Err(invalid("rule_id must not be empty"));
    }
    match wire.evaluation_locus.as_deref() {
        None | Some("client") => {}
        Some("server") => {
            return Err(RuleError::new(
                RuleErrorCode::UnsupportedFeature,
                Some(id),
                "evaluation_locus \"server\" is reserved; v1 rules are evaluated on the client",
            ));
        }
        Some(_) => {
            return Err(RuleError::new(
                RuleErrorCode::SchemaViolation,
                Some(id),
                "evaluation_locus must be \"client\"",
            ));
        }
    }
    if wire.actions.is_empty() {
        return Err(invalid("a rule needs at least one action"));
    }
    let actions: BTreeSet<Action> = wire.actions.iter().copied().collect();
    if actions.len() != wire.actions.len() {
        return Err(invalid("an action appears twice"));
    }
    if actions.contains(&Action::Notify) && actions.contains(&Action::DontNotify) {
        return Err(invalid("notify and dont_notify contradict each other"));
    }
    let mut conditions = Vec::with_capacity(wire.conditions.len());
    for c in wire.conditions {
        conditions.push(match c {
            ConditionWire::FieldMatch { field, pattern } => {
                if field.is_empty() || pattern.is_empty() {
                    return Err(invalid("field_match needs a field and a pattern"));
                }
                Condition::FieldMatch { field, pattern }
            }
            ConditionWire::ContainsKeyword { pattern } => {
                let alternatives: Vec<String> = pattern.split('|').map(str::to_lowercase).collect();
                if alternatives.iter().any(String::is_empty) {
                    return Err(invalid("contains_keyword has an empty alternative"));
                }
                Condition::ContainsKeyword { alternatives }
            }
            ConditionWire::MentionsActor {} => Condition::MentionsActor,
            ConditionWire::IsDirectMessage {} => Condition::IsDirectMessage,
            ConditionWire::MemberCount { op, value } => {
                let predicate = MemberCountPredicate::new(&op, value).map_err(|e| invalid(&e))?;
                // §4.3: a predicate that splits a bucket is refused here,
                // never resolved later from a precise count.
                grid.check(&predicate).map_err(|e| invalid(&e))?;
                Condition::MemberCount(predicate)
            }
            ConditionWire::StrandTrack { pattern } => Condition::StrandTrack {
                patterns: non_empty_patterns(pattern, "strand_track").map_err(|e| invalid(&e))?,
            },
            ConditionWire::WatchState { pattern } => {
                Condition::WatchState { patterns: non_empty_patterns(pattern, "watch_state").map_err(|e| invalid(&e))? }
            }
        });
    }
    Ok(Rule { rule_id: wire.rule_id, kind: wire.kind, enabled: wire.enabled, conditions, actions: wire.actions })
}

fn non_empty_patterns(p: Patterns, what: &str) -> Result<Vec<String>, String> {
    let v = p.into_vec();
    if v.is_empty() || v.iter().any(String::is_empty) {
        return Err(format!("{what} needs non-empty patterns"));
    }
    Ok(v)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The §4.1 example, verbatim.
    pub(crate) const SPEC_EXAMPLE: &str = r#"{
      "rules": [
        { "rule_id": "override.mute-realm-x", "kind": "override", "enabled": true,
          "conditions": [ { "kind": "field_match", "field": "realm_id", "pattern": "ak:realm:AUXJQDk6Ju_WYm3B2b23k1q5DEwVlFMwJ0UqCPVJz58U..." } ],
          "actions": ["dont_notify"] },
        { "rule_id": "content.keyword-urgent", "kind": "content", "enabled": true,
          "conditions": [ { "kind": "contains_keyword", "pattern": "urgent|紧急|P0" } ],
          "actions": ["notify", "sound_critical"] },
        { "rule_id": "underride.dm", "kind": "underride", "enabled": true,
          "conditions": [ { "kind": "field_match", "field": "kind", "pattern": "ak.message.create" }, { "kind": "is_direct_message" } ],
          "actions": ["notify", "sound_default"] },
        { "rule_id": "underride.mention", "kind": "underride", "enabled": true,
          "conditions": [ { "kind": "mentions_actor" } ],
          "actions": ["notify", "highlight"] }
      ]
    }"#;

    fn rule(body: &str) -> String {
        format!(r#"{{"rules":[{body}]}}"#)
    }

    fn code(json: &str) -> RuleErrorCode {
        RuleSet::parse(json.as_bytes()).unwrap_err().code
    }

    #[test]
    fn the_spec_examples_parse() {
        let set = RuleSet::parse(SPEC_EXAMPLE.as_bytes()).unwrap();
        assert_eq!(set.rules().len(), 4);
        let strand = r#"[
          {"rule_id":"underride.strand-synthesis-all","kind":"underride","enabled":true,"evaluation_locus":"client",
           "conditions":[{"kind":"strand_track","pattern":"synthesis"}],"actions":["notify"]},
          {"rule_id":"override.respect-mute","kind":"override","enabled":true,"evaluation_locus":"client",
           "conditions":[{"kind":"watch_state","pattern":"muted"}],"actions":["dont_notify"]},
          {"rule_id":"underride.watching-all","kind":"underride","enabled":true,"evaluation_locus":"client",
           "conditions":[{"kind":"watch_state","pattern":["participating","all"]}],"actions":["notify"]}
        ]"#;
        let set = RuleSet::parse(format!(r#"{{"rules":{strand}}}"#).as_bytes()).unwrap();
        let order: Vec<&str> = set.rules().iter().map(|r| r.rule_id.as_str()).collect();
        assert_eq!(order, ["override.respect-mute", "underride.strand-synthesis-all", "underride.watching-all"]);
    }

    #[test]
    fn a_server_locus_is_unsupported_and_any_other_locus_a_schema_violation() {
        let r = |locus: &str| {
            rule(&format!(
                r#"{{"rule_id":"a","kind":"content","enabled":true,"evaluation_locus":"{locus}","conditions":[],"actions":["notify"]}}"#
            ))
        };
        assert_eq!(code(&r("server")), RuleErrorCode::UnsupportedFeature);
        assert_eq!(code(&r("edge")), RuleErrorCode::SchemaViolation);
        assert!(RuleSet::parse(r("client").as_bytes()).is_ok());
    }

    #[test]
    fn the_shape_is_closed() {
        let base = r#""rule_id":"a","kind":"content","enabled":true,"conditions":[],"actions":["notify"]"#;
        assert_eq!(code(&rule(&format!("{{{base},\"extra\":1}}"))), RuleErrorCode::SchemaViolation);
        assert_eq!(code(r#"{"rules":[],"more":1}"#), RuleErrorCode::SchemaViolation);
        assert_eq!(
            code(&rule(r#"{"rule_id":"a","kind":"content","conditions":[],"actions":["notify"]}"#)),
            RuleErrorCode::SchemaViolation
        );
        assert_eq!(
            code(&rule(r#"{"rule_id":"a","kind":"sender","enabled":true,"conditions":[],"actions":["notify"]}"#)),
            RuleErrorCode::SchemaViolation
        );
        assert_eq!(
            code(&rule(r#"{"rule_id":"a","kind":"content","enabled":true,"conditions":[],"actions":["buzz"]}"#)),
            RuleErrorCode::SchemaViolation
        );
        assert_eq!(
            code(&rule(
                r#"{"rule_id":"a","kind":"content","enabled":true,"conditions":[{"kind":"room_size"}],"actions":["notify"]}"#
            )),
            RuleErrorCode::SchemaViolation
        );
        assert_eq!(
            code(&rule(
                r#"{"rule_id":"a","kind":"content","enabled":true,"conditions":[{"kind":"mentions_actor","x":1}],"actions":["notify"]}"#
            )),
            RuleErrorCode::SchemaViolation
        );
    }

    #[test]
    fn bad_values_are_param_invalid() {
        let with = |conditions: &str, actions: &str| {
            rule(&format!(
                r#"{{"rule_id":"a","kind":"content","enabled":true,"conditions":[{conditions}],"actions":[{actions}]}}"#
            ))
        };
        for (c, a) in [
            ("", ""),
            ("", r#""notify","dont_notify""#),
            ("", r#""notify","notify""#),
            (r#"{"kind":"contains_keyword","pattern":"a||b"}"#, r#""notify""#),
            (r#"{"kind":"field_match","field":"","pattern":"x"}"#, r#""notify""#),
            (r#"{"kind":"strand_track","pattern":[]}"#, r#""notify""#),
            (r#"{"kind":"watch_state","pattern":""}"#, r#""notify""#),
            (r#"{"kind":"member_count","op":"<=","value":5}"#, r#""notify""#),
            (r#"{"kind":"member_count","op":"~","value":10}"#, r#""notify""#),
        ] {
            assert_eq!(code(&with(c, a)), RuleErrorCode::ParamInvalid, "{c} / {a}");
        }
        assert!(
            RuleSet::parse(with(r#"{"kind":"member_count","op":"<=","value":10}"#, r#""notify""#).as_bytes()).is_ok()
        );
        let twice = r#"{"rules":[
          {"rule_id":"a","kind":"content","enabled":true,"conditions":[],"actions":["notify"]},
          {"rule_id":"a","kind":"override","enabled":true,"conditions":[],"actions":["notify"]}]}"#;
        let err = RuleSet::parse(twice.as_bytes()).unwrap_err();
        assert_eq!((err.code, err.rule_id.as_deref()), (RuleErrorCode::ParamInvalid, Some("a")));
        assert_eq!(
            code(&rule(r#"{"rule_id":"","kind":"content","enabled":true,"conditions":[],"actions":["notify"]}"#)),
            RuleErrorCode::ParamInvalid
        );
    }
}
