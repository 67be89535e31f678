//! First-match evaluation of the chain (§4.1, §4.5): the whole chain from
//! the highest kind down, the first enabled rule whose conditions all hold
//! decides. A condition the client lacks precise data for is indeterminate:
//! its rule neither matches nor blocks, and evaluation goes on to the next
//! rule (§4.3: never notify on a guess).

use std::collections::BTreeMap;

use super::member_count::MemberCount;
use super::pattern::glob_matches;
use super::{Action, Condition, Rule, RuleSet};

/// What the client knows about one decrypted, verified event. `None` means
/// "not known precisely" where the spec says so.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventContext {
    /// Authorised event metadata and payload fields for `field_match`
    /// (`kind`, `realm_id`, ...). A field that is absent does not match.
    pub fields: BTreeMap<String, String>,
    /// The decrypted body; `None` when there is none to read.
    pub body: Option<String>,
    /// Direct or audience mention of this actor; `None`: not resolved.
    pub mentions_actor: Option<bool>,
    /// A verified 1:1 Direct Conversation; `None`: not disclosed.
    pub is_direct_message: Option<bool>,
    /// From the client's own roster reads; `None`: not disclosed.
    pub member_count: Option<MemberCount>,
    /// Track names derived from the event (§4.3.1); empty when the event
    /// belongs to no strand or derives none: strand_track is then false.
    pub strand_tracks: Vec<String>,
    /// The receiver's watch level (§4.3.2).
    pub watch_state: Option<String>,
}

/// The outcome of one evaluation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The rule that matched; `None` when none did.
    pub rule_id: Option<String>,
    /// Its actions (empty when none matched).
    pub actions: Vec<Action>,
    /// Whether the user should be notified: the matched rule says notify.
    pub notify: bool,
    /// Rules passed over because a condition was indeterminate.
    pub indeterminate: Vec<String>,
    /// DND held back a notification the chain wanted (see
    /// [`crate::dnd::decide`]).
    pub quieted: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Truth {
    True,
    False,
    Indeterminate,
}

impl From<bool> for Truth {
    fn from(b: bool) -> Truth {
        if b { Truth::True } else { Truth::False }
    }
}

fn known(value: Option<bool>) -> Truth {
    value.map_or(Truth::Indeterminate, Truth::from)
}

fn condition(c: &Condition, event: &EventContext) -> Truth {
    match c {
        Condition::FieldMatch { field, pattern } => {
            event.fields.get(field).is_some_and(|v| glob_matches(pattern, v)).into()
        }
        Condition::ContainsKeyword { alternatives } => match &event.body {
            Some(body) => {
                let body = body.to_lowercase();
                alternatives.iter().any(|k| body.contains(k.as_str())).into()
            }
            None => Truth::Indeterminate,
        },
        Condition::MentionsActor => known(event.mentions_actor),
        Condition::IsDirectMessage => known(event.is_direct_message),
        Condition::MemberCount(predicate) => match &event.member_count {
            Some(MemberCount::Exact(n)) => predicate.holds(*n).into(),
            // A split bucket cannot reach here (refused at save); should a
            // host's grid differ from the one the rule was saved against,
            // the bucket stays indeterminate rather than guessed.
            Some(MemberCount::Bucket(b)) => known(predicate.on_bucket(b)),
            None => Truth::Indeterminate,
        },
        Condition::StrandTrack { patterns } => {
            event.strand_tracks.iter().any(|t| patterns.iter().any(|p| glob_matches(p, t))).into()
        }
        Condition::WatchState { patterns } => {
            event.watch_state.as_deref().is_some_and(|w| patterns.iter().any(|p| glob_matches(p, w))).into()
        }
    }
}

fn rule_truth(rule: &Rule, event: &EventContext) -> Truth {
    let mut result = Truth::True;
    for c in &rule.conditions {
        match condition(c, event) {
            Truth::False => return Truth::False,
            Truth::Indeterminate => result = Truth::Indeterminate,
            Truth::True => {}
        }
    }
    result
}

pub fn evaluate(rules: &RuleSet, event: &EventContext) -> Decision {
    let mut indeterminate = Vec::new();
    for rule in rules.rules().iter().filter(|r| r.enabled) {
        match rule_truth(rule, event) {
            Truth::True => {
                return Decision {
                    rule_id: Some(rule.rule_id.clone()),
                    actions: rule.actions.clone(),
                    notify: rule.actions.contains(&Action::Notify),
                    indeterminate,
                    quieted: false,
                };
            }
            Truth::Indeterminate => indeterminate.push(rule.rule_id.clone()),
            Truth::False => {}
        }
    }
    Decision { rule_id: None, actions: Vec::new(), notify: false, indeterminate, quieted: false }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::push_rules::member_count::{BucketGrid, MemberCount};
    use crate::push_rules::tests::SPEC_EXAMPLE;

    fn spec() -> RuleSet {
        RuleSet::parse(SPEC_EXAMPLE.as_bytes()).unwrap()
    }

    fn message(body: &str) -> EventContext {
        EventContext {
            fields: BTreeMap::from([
                ("kind".into(), "ak.message.create".into()),
                ("realm_id".into(), "ak:realm:other".into()),
            ]),
            body: Some(body.into()),
            mentions_actor: Some(false),
            is_direct_message: Some(false),
            ..EventContext::default()
        }
    }

    #[test]
    fn override_beats_content_beats_underride() {
        let mut muted = message("URGENT: deploy");
        muted.fields.insert("realm_id".into(), "ak:realm:AUXJQDk6Ju_WYm3B2b23k1q5DEwVlFMwJ0UqCPVJz58U...".into());
        let d = evaluate(&spec(), &muted);
        assert_eq!((d.rule_id.as_deref(), d.notify), (Some("override.mute-realm-x"), false));

        let d = evaluate(&spec(), &message("this is URGENT"));
        assert_eq!(d.rule_id.as_deref(), Some("content.keyword-urgent"));
        assert_eq!(d.actions, vec![Action::Notify, Action::SoundCritical]);
        assert!(evaluate(&spec(), &message("紧急 please")).notify);

        let mut dm = message("hi");
        dm.is_direct_message = Some(true);
        assert_eq!(evaluate(&spec(), &dm).rule_id.as_deref(), Some("underride.dm"));

        let mut mention = message("hi");
        mention.mentions_actor = Some(true);
        let d = evaluate(&spec(), &mention);
        assert_eq!(
            (d.rule_id.as_deref(), d.actions.clone()),
            (Some("underride.mention"), vec![Action::Notify, Action::Highlight])
        );

        let d = evaluate(&spec(), &message("hi"));
        assert_eq!((d.rule_id, d.notify), (None, false), "no rule matched: no notification");
    }

    #[test]
    fn rules_are_ordered_by_kind_whatever_their_stored_order() {
        let json = r#"{"rules":[
          {"rule_id":"u","kind":"underride","enabled":true,"conditions":[],"actions":["notify"]},
          {"rule_id":"c","kind":"content","enabled":true,"conditions":[],"actions":["notify","highlight"]},
          {"rule_id":"o","kind":"override","enabled":false,"conditions":[],"actions":["dont_notify"]}]}"#;
        let d = evaluate(&RuleSet::parse(json.as_bytes()).unwrap(), &EventContext::default());
        assert_eq!(d.rule_id.as_deref(), Some("c"), "disabled override skipped, content before underride");
    }

    #[test]
    fn missing_precise_data_is_indeterminate_and_evaluation_goes_on() {
        // A DM rule on an event whose DM status was not disclosed: skipped,
        // not matched, not blocking; the mention rule decides.
        let mut e = message("hi");
        e.is_direct_message = None;
        e.mentions_actor = Some(true);
        let d = evaluate(&spec(), &e);
        assert_eq!(d.rule_id.as_deref(), Some("underride.mention"));
        assert_eq!(d.indeterminate, vec!["underride.dm".to_string()]);

        // No body (not decrypted): the keyword rule is indeterminate.
        let mut e = message("");
        e.body = None;
        e.mentions_actor = None;
        e.is_direct_message = None;
        let d = evaluate(&spec(), &e);
        assert_eq!((d.rule_id, d.notify), (None, false), "never notify on a guess");
        assert_eq!(d.indeterminate.len(), 3);

        // A false condition beats an indeterminate one in the same rule.
        let mut e = message("hi");
        e.fields.insert("kind".into(), "ak.reaction.add".into());
        e.is_direct_message = None;
        assert!(evaluate(&spec(), &e).indeterminate.is_empty());
    }

    #[test]
    fn member_count_on_exact_counts_buckets_and_nothing() {
        let json = r#"{"rules":[{"rule_id":"small","kind":"underride","enabled":true,
          "conditions":[{"kind":"member_count","op":"<=","value":10}],"actions":["notify"]}]}"#;
        let set = RuleSet::parse(json.as_bytes()).unwrap();
        let with = |mc| EventContext { member_count: mc, ..EventContext::default() };
        assert!(evaluate(&set, &with(Some(MemberCount::Exact(3)))).notify);
        assert!(!evaluate(&set, &with(Some(MemberCount::Exact(11)))).notify);
        let grid = BucketGrid::default();
        assert!(evaluate(&set, &with(Some(MemberCount::Bucket(grid.buckets()[0].clone())))).notify);
        assert!(!evaluate(&set, &with(Some(MemberCount::Bucket(grid.buckets()[1].clone())))).notify);
        assert_eq!(evaluate(&set, &with(None)).indeterminate, vec!["small".to_string()]);
    }

    #[test]
    fn strand_tracks_and_watch_states() {
        let json = r#"{"rules":[
          {"rule_id":"override.respect-mute","kind":"override","enabled":true,"evaluation_locus":"client",
           "conditions":[{"kind":"watch_state","pattern":"muted"}],"actions":["dont_notify"]},
          {"rule_id":"underride.strand-synthesis-all","kind":"underride","enabled":true,"evaluation_locus":"client",
           "conditions":[{"kind":"strand_track","pattern":"synthesis"}],"actions":["notify"]},
          {"rule_id":"underride.strand-discussion-mention-only","kind":"underride","enabled":true,"evaluation_locus":"client",
           "conditions":[{"kind":"strand_track","pattern":"discussion"},{"kind":"mentions_actor"}],"actions":["notify","highlight"]},
          {"rule_id":"underride.watching-all","kind":"underride","enabled":true,"evaluation_locus":"client",
           "conditions":[{"kind":"watch_state","pattern":["participating","all"]}],"actions":["notify"]}]}"#;
        let set = RuleSet::parse(json.as_bytes()).unwrap();
        let event = |tracks: &[&str], mention: bool, watch: &str| EventContext {
            strand_tracks: tracks.iter().map(|t| t.to_string()).collect(),
            mentions_actor: Some(mention),
            watch_state: Some(watch.into()),
            ..EventContext::default()
        };
        let id = |e: &EventContext| evaluate(&set, e).rule_id;
        assert_eq!(id(&event(&["synthesis"], false, "muted")).as_deref(), Some("override.respect-mute"));
        assert_eq!(
            id(&event(&["synthesis"], false, "mentions_only")).as_deref(),
            Some("underride.strand-synthesis-all")
        );
        assert_eq!(
            id(&event(&["discussion"], true, "mentions_only")).as_deref(),
            Some("underride.strand-discussion-mention-only")
        );
        assert_eq!(id(&event(&["discussion"], false, "mentions_only")), None);
        assert_eq!(id(&event(&["discussion"], false, "all")).as_deref(), Some("underride.watching-all"));
        // Several tracks from one event: any match counts.
        assert_eq!(
            id(&event(&["discussion", "synthesis"], false, "x")).as_deref(),
            Some("underride.strand-synthesis-all")
        );
        // No strand: strand_track is simply false.
        assert_eq!(id(&event(&[], true, "x")), None);
    }
}
