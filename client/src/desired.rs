//! The desired set of PUSH-238, from the host's conversations, the
//! overrides and the rules alone: no backend call.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::host::{Conversation, ConversationKind};
use crate::state::{Override, Rules};
use crate::topic::{GroupId, Topic};

/// A topic the client wants stored on the backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredSubscription {
    pub topic: Topic,
    /// The group whose keys go with it; `None` for the welcome topic, which
    /// carries no keys.
    pub group: Option<GroupId>,
    pub include_commits: bool,
}

/// The desired set, keyed by topic.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredSet {
    pub subscriptions: BTreeMap<Topic, DesiredSubscription>,
}

impl DesiredSet {
    /// Names the set of topics: RESOURCE_EXHAUSTED holds adds back until it
    /// changes (PUSH-262).
    pub fn digest(&self) -> [u8; 32] {
        let mut hash = Sha256::new();
        for topic in self.subscriptions.keys() {
            hash.update((topic.as_bytes().len() as u32).to_be_bytes());
            hash.update(topic.as_bytes());
        }
        hash.finalize().into()
    }

    pub fn len(&self) -> usize {
        self.subscriptions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.subscriptions.is_empty()
    }
}

/// A conversation's effective value: its override when it has one, else
/// whether its consent state is one the rules enable.
pub fn effective_value(conversation: &Conversation, overrides: &BTreeMap<GroupId, Override>, rules: &Rules) -> bool {
    match overrides.get(&conversation.group_id) {
        Some(Override::Enabled) => true,
        Some(Override::Disabled) => false,
        None => rules.consent_states.contains(&conversation.consent),
    }
}

/// PUSH-238: every group and DM with the installation an active member and
/// an enabled effective value; the welcome topic while include_welcomes;
/// every active sync group while include_sync_groups; nothing else.
pub fn desired_set(
    conversations: &[Conversation],
    overrides: &BTreeMap<GroupId, Override>,
    rules: &Rules,
    welcome: Option<Topic>,
) -> DesiredSet {
    let mut set = DesiredSet::default();
    for c in conversations.iter().filter(|c| c.active_member) {
        let wanted = match c.kind {
            ConversationKind::Group | ConversationKind::Dm => effective_value(c, overrides, rules),
            ConversationKind::Sync => rules.include_sync_groups,
        };
        if wanted {
            let topic = c.group_id.topic();
            set.subscriptions.insert(
                topic.clone(),
                DesiredSubscription { topic, group: Some(c.group_id.clone()), include_commits: rules.include_commits },
            );
        }
    }
    if rules.include_welcomes
        && let Some(topic) = welcome
    {
        set.subscriptions.insert(topic.clone(), DesiredSubscription { topic, group: None, include_commits: false });
    }
    set
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ConsentState;
    use std::collections::BTreeSet;

    fn conv(id: u8, kind: ConversationKind, active: bool, consent: ConsentState) -> Conversation {
        Conversation { group_id: GroupId::new(vec![id]).unwrap(), kind, active_member: active, consent }
    }

    fn topics(set: &DesiredSet) -> Vec<Vec<u8>> {
        set.subscriptions.keys().map(|t| t.as_bytes().to_vec()).collect()
    }

    fn welcome() -> Topic {
        Topic::welcome(&[0xee]).unwrap()
    }

    #[test]
    fn active_allowed_groups_and_dms_and_the_welcome_topic_by_default() {
        use ConsentState::*;
        use ConversationKind::*;
        let convs = [
            conv(1, Group, true, Allowed),
            conv(2, Dm, true, Allowed),
            conv(3, Group, false, Allowed),
            conv(4, Group, true, Unknown),
            conv(5, Dm, true, Denied),
            conv(6, Sync, true, Allowed),
        ];
        let set = desired_set(&convs, &BTreeMap::new(), &Rules::default(), Some(welcome()));
        assert_eq!(topics(&set), vec![vec![0, 1], vec![0, 2], vec![1, 0xee]]);
        let w = &set.subscriptions[&welcome()];
        assert_eq!((w.group.as_ref(), w.include_commits), (None, false), "the welcome topic has no keys");
    }

    #[test]
    fn overrides_replace_the_consent_rule() {
        use ConsentState::*;
        let convs = [conv(1, ConversationKind::Group, true, Denied), conv(2, ConversationKind::Group, true, Allowed)];
        let overrides = BTreeMap::from([
            (GroupId::new(vec![1]).unwrap(), Override::Enabled),
            (GroupId::new(vec![2]).unwrap(), Override::Disabled),
        ]);
        let set = desired_set(&convs, &overrides, &Rules::default(), None);
        assert_eq!(topics(&set), vec![vec![0, 1]]);
        assert!(effective_value(&convs[0], &overrides, &Rules::default()));
        assert!(!effective_value(&convs[1], &overrides, &Rules::default()));
        assert!(effective_value(&convs[1], &BTreeMap::new(), &Rules::default()));
    }

    #[test]
    fn an_override_never_brings_back_a_group_the_installation_left() {
        let convs = [conv(1, ConversationKind::Group, false, ConsentState::Allowed)];
        let overrides = BTreeMap::from([(GroupId::new(vec![1]).unwrap(), Override::Enabled)]);
        assert!(desired_set(&convs, &overrides, &Rules::default(), None).is_empty());
    }

    #[test]
    fn the_rules_choose_consent_states_welcomes_sync_groups_and_commits() {
        use ConsentState::*;
        let convs = [
            conv(1, ConversationKind::Group, true, Unknown),
            conv(2, ConversationKind::Sync, true, Denied),
            conv(3, ConversationKind::Sync, false, Allowed),
        ];
        let rules = Rules {
            consent_states: BTreeSet::from([Allowed, Unknown]),
            include_welcomes: false,
            include_sync_groups: true,
            include_commits: true,
        };
        let set = desired_set(&convs, &BTreeMap::new(), &rules, Some(welcome()));
        assert_eq!(topics(&set), vec![vec![0, 1], vec![0, 2]]);
        assert!(set.subscriptions.values().all(|s| s.include_commits && s.group.is_some()));
    }

    #[test]
    fn the_digest_follows_the_topics() {
        let a = conv(1, ConversationKind::Group, true, ConsentState::Allowed);
        let b = conv(2, ConversationKind::Group, true, ConsentState::Allowed);
        let one = desired_set(std::slice::from_ref(&a), &BTreeMap::new(), &Rules::default(), None);
        let two = desired_set(&[a.clone(), b], &BTreeMap::new(), &Rules::default(), None);
        assert_ne!(one.digest(), two.digest());
        assert_eq!(one.digest(), desired_set(&[a], &BTreeMap::new(), &Rules::default(), None).digest());
    }
}
