//! One sync run's changes (PUSH-260): adds = desired − uploaded (plus the
//! desired topics whose uploaded key window or flags are stale, PUSH-229),
//! removes = uploaded − desired, cut into requests of at most 1000
//! subscriptions. Pure: the run decides what to do with the answers.

use std::collections::BTreeMap;

use crate::desired::{DesiredSet, DesiredSubscription};
use crate::sender_key::{HmacEpoch, RootKeyId, window_lapses};
use crate::state::UploadedSubscription;
use crate::topic::Topic;

/// Spec 000 §8: at most 1000 subscriptions per request.
pub const MAX_BATCH: usize = 1000;

/// What the plan needs to know besides the two sets.
#[derive(Clone, Copy, Debug)]
pub struct PlanInputs {
    pub current_epoch: HmacEpoch,
    /// The root key now, if the installation has one.
    pub root_key_id: Option<RootKeyId>,
    /// After a count mismatch: every desired topic is sent again.
    pub resend_all: bool,
    /// After RESOURCE_EXHAUSTED, while the desired set is unchanged.
    pub adds_blocked: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub removes: Vec<Topic>,
    pub adds: Vec<DesiredSubscription>,
}

/// One request's share of a plan. Removes and adds never share a request:
/// a RESOURCE_EXHAUSTED on adds then never holds back a remove (PUSH-262).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Batch {
    Removes(Vec<Topic>),
    Adds(Vec<DesiredSubscription>),
}

/// Whether an uploaded subscription must be sent again for `desired`.
pub fn stale(uploaded: &UploadedSubscription, desired: &DesiredSubscription, inputs: &PlanInputs) -> bool {
    if !uploaded.confirmed || uploaded.include_commits != desired.include_commits {
        return true;
    }
    if desired.group.is_none() {
        return false;
    }
    // PUSH-229: a new root key, keys now known, or a window that no longer
    // covers the epoch after the current one.
    match (inputs.root_key_id, uploaded.root_key_id, uploaded.hmac_epoch_base) {
        (None, _, _) => false,
        (Some(now), Some(sent), Some(base)) => now != sent || window_lapses(HmacEpoch(base), inputs.current_epoch),
        (Some(_), _, _) => true,
    }
}

pub fn plan(desired: &DesiredSet, uploaded: &BTreeMap<Topic, UploadedSubscription>, inputs: &PlanInputs) -> Plan {
    let removes = uploaded.keys().filter(|t| !desired.subscriptions.contains_key(*t)).cloned().collect();
    let adds = if inputs.adds_blocked {
        Vec::new()
    } else {
        desired
            .subscriptions
            .values()
            .filter(|d| inputs.resend_all || uploaded.get(&d.topic).is_none_or(|u| stale(u, d, inputs)))
            .cloned()
            .collect()
    };
    Plan { removes, adds }
}

/// Removes first (they free room), then adds, each in requests of at most
/// `max` subscriptions.
pub fn batches(plan: Plan, max: usize) -> Vec<Batch> {
    let max = max.clamp(1, MAX_BATCH);
    let mut out: Vec<Batch> = plan.removes.chunks(max).map(|c| Batch::Removes(c.to_vec())).collect();
    out.extend(plan.adds.chunks(max).map(|c| Batch::Adds(c.to_vec())));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sender_key::RootKey;
    use crate::topic::GroupId;

    fn group(n: u32) -> DesiredSubscription {
        let id = GroupId::new(n.to_be_bytes().to_vec()).unwrap();
        DesiredSubscription { topic: id.topic(), group: Some(id), include_commits: false }
    }

    fn desired(subs: impl IntoIterator<Item = DesiredSubscription>) -> DesiredSet {
        DesiredSet { subscriptions: subs.into_iter().map(|s| (s.topic.clone(), s)).collect() }
    }

    fn sent(base: Option<i64>, root: Option<RootKeyId>) -> UploadedSubscription {
        UploadedSubscription { hmac_epoch_base: base, root_key_id: root, include_commits: false, confirmed: true }
    }

    fn root_id(n: u8) -> RootKeyId {
        RootKey::new(&[n; 42]).unwrap().id()
    }

    fn inputs() -> PlanInputs {
        PlanInputs {
            current_epoch: HmacEpoch(655),
            root_key_id: Some(root_id(1)),
            resend_all: false,
            adds_blocked: false,
        }
    }

    #[test]
    fn adds_are_desired_minus_uploaded_and_removes_uploaded_minus_desired() {
        let want = desired([group(1), group(2)]);
        let uploaded = BTreeMap::from([
            (group(2).topic, sent(Some(654), Some(root_id(1)))),
            (group(3).topic, sent(Some(654), Some(root_id(1)))),
        ]);
        let p = plan(&want, &uploaded, &inputs());
        assert_eq!(p.adds, vec![group(1)]);
        assert_eq!(p.removes, vec![group(3).topic]);
    }

    #[test]
    fn twenty_five_hundred_adds_go_as_1000_1000_500() {
        let want = desired((0..2500).map(group));
        let sizes: Vec<usize> = batches(plan(&want, &BTreeMap::new(), &inputs()), MAX_BATCH)
            .iter()
            .map(|b| match b {
                Batch::Adds(a) => a.len(),
                Batch::Removes(_) => panic!("no removes expected"),
            })
            .collect();
        assert_eq!(sizes, vec![1000, 1000, 500]);
    }

    #[test]
    fn removes_go_first_and_never_share_a_request_with_adds() {
        let want = desired((0..1200).map(group));
        let uploaded: BTreeMap<_, _> =
            (5000..5300).map(|n| (group(n).topic, sent(Some(654), Some(root_id(1))))).collect();
        let b = batches(plan(&want, &uploaded, &inputs()), MAX_BATCH);
        let shape: Vec<(char, usize)> = b
            .iter()
            .map(|b| match b {
                Batch::Removes(r) => ('r', r.len()),
                Batch::Adds(a) => ('a', a.len()),
            })
            .collect();
        assert_eq!(shape, vec![('r', 300), ('a', 1000), ('a', 200)]);
        let removed: std::collections::BTreeSet<_> =
            b.iter().filter_map(|b| if let Batch::Removes(r) = b { Some(r.clone()) } else { None }).flatten().collect();
        assert!(want.subscriptions.keys().all(|t| !removed.contains(t)), "a topic is never both added and removed");
    }

    #[test]
    fn a_lapsing_window_a_new_root_key_or_a_late_root_key_re_sends() {
        let want = desired([group(1)]);
        let at = |base, root| BTreeMap::from([(group(1).topic, sent(base, root))]);
        assert!(plan(&want, &at(Some(654), Some(root_id(1))), &inputs()).adds.is_empty(), "window 654 covers 655, 656");
        let next_epoch = PlanInputs { current_epoch: HmacEpoch(656), ..inputs() };
        assert_eq!(plan(&want, &at(Some(654), Some(root_id(1))), &next_epoch).adds.len(), 1, "656 ≥ 654 + 2");
        assert_eq!(plan(&want, &at(Some(654), Some(root_id(2))), &inputs()).adds.len(), 1, "root key changed");
        assert_eq!(plan(&want, &at(None, None), &inputs()).adds.len(), 1, "the root key arrived");
        let clock_back = PlanInputs { current_epoch: HmacEpoch(652), ..inputs() };
        assert_eq!(plan(&want, &at(Some(654), Some(root_id(1))), &clock_back).adds.len(), 1, "653 < 654");
        let no_root = PlanInputs { root_key_id: None, ..inputs() };
        assert!(plan(&want, &at(None, None), &no_root).adds.is_empty(), "still no key: nothing new to send");
    }

    #[test]
    fn unanswered_entries_and_changed_commit_flags_re_send() {
        let want = desired([group(1)]);
        let mut pending = sent(Some(654), Some(root_id(1)));
        pending.confirmed = false;
        assert_eq!(plan(&want, &BTreeMap::from([(group(1).topic, pending)]), &inputs()).adds.len(), 1);
        let mut flagged = sent(Some(654), Some(root_id(1)));
        flagged.include_commits = true;
        assert_eq!(plan(&want, &BTreeMap::from([(group(1).topic, flagged)]), &inputs()).adds.len(), 1);
    }

    #[test]
    fn resend_all_sends_every_desired_topic_and_keeps_the_removes() {
        let want = desired([group(1), group(2)]);
        let uploaded = BTreeMap::from([
            (group(1).topic, sent(Some(654), Some(root_id(1)))),
            (group(9).topic, sent(Some(654), Some(root_id(1)))),
        ]);
        let p = plan(&want, &uploaded, &PlanInputs { resend_all: true, ..inputs() });
        assert_eq!(p.adds, vec![group(1), group(2)]);
        assert_eq!(p.removes, vec![group(9).topic]);
    }

    #[test]
    fn blocked_adds_leave_only_removes() {
        let want = desired([group(1)]);
        let uploaded = BTreeMap::from([(group(9).topic, sent(Some(654), Some(root_id(1))))]);
        let p = plan(&want, &uploaded, &PlanInputs { adds_blocked: true, ..inputs() });
        assert!(p.adds.is_empty());
        assert_eq!(p.removes, vec![group(9).topic]);
    }
}
