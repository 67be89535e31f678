use std::collections::HashSet;

use super::{ParseError, Topic};

pub const HMAC_KEY_LEN: usize = 42;
pub const MAX_HMAC_KEYS: usize = 3;

/// One 42-byte HMAC key of a key window. Debug hides it. Hash: dispatch
/// hashes a page's envelope once per distinct key (PUSH-230).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct HmacKey(pub [u8; HMAC_KEY_LEN]);

crate::domain::redacted_debug!(HmacKey);

/// Up to three keys for consecutive HMAC epochs starting at `epoch_base`.
/// Only exists with at least one key: no base is stored without keys (section 3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyWindow {
    epoch_base: i64,
    keys: Vec<HmacKey>,
}

impl KeyWindow {
    /// `None` for an empty key list, whatever the base says.
    pub fn parse(epoch_base: i64, keys: &[Vec<u8>]) -> Result<Option<Self>, ParseError> {
        if keys.len() > MAX_HMAC_KEYS {
            return Err(ParseError("a subscription carries more than 3 hmac_keys"));
        }
        let keys = keys
            .iter()
            .map(|k| {
                <[u8; HMAC_KEY_LEN]>::try_from(k.as_slice())
                    .map(HmacKey)
                    .map_err(|_| ParseError("every hmac key must be 42 bytes"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() {
            return Ok(None);
        }
        if epoch_base < 0 {
            return Err(ParseError("hmac_epoch_base must not be negative"));
        }
        Ok(Some(Self { epoch_base, keys }))
    }

    pub fn epoch_base(&self) -> i64 {
        self.epoch_base
    }

    pub fn keys(&self) -> &[HmacKey] {
        &self.keys
    }

    /// The key for an HMAC epoch, if the window covers it (PUSH-230).
    pub fn key_for_epoch(&self, epoch: i64) -> Option<&HmacKey> {
        let index = epoch.checked_sub(self.epoch_base)?;
        usize::try_from(index).ok().and_then(|i| self.keys.get(i))
    }
}

/// A subscription as a client sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    pub topic: Topic,
    pub keys: Option<KeyWindow>,
    pub include_commits: bool,
}

/// A subscription as stored: with the start position fixed when first stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSubscription {
    pub subscription: Subscription,
    /// The shard's closed allocation boundary read in the storing transaction (PUSH-216).
    pub start_position: u64,
}

/// A validated UpdateSubscriptions payload (PUSH-215): no topic twice across
/// adds and removes, every topic subscribable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubscriptionUpdate {
    pub adds: Vec<Subscription>,
    pub removes: Vec<Topic>,
}

impl SubscriptionUpdate {
    pub fn new(adds: Vec<Subscription>, removes: Vec<Topic>) -> Result<Self, ParseError> {
        let mut seen = HashSet::with_capacity(adds.len() + removes.len());
        for topic in adds.iter().map(|s| &s.topic).chain(removes.iter()) {
            if !seen.insert(topic) {
                return Err(ParseError("a topic appears more than once across adds and removes"));
            }
        }
        Ok(Self { adds, removes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_window_rules() {
        let k = vec![7u8; 42];
        assert_eq!(KeyWindow::parse(-5, &[]).unwrap(), None, "no base without keys");
        assert!(KeyWindow::parse(-1, std::slice::from_ref(&k)).is_err());
        assert!(KeyWindow::parse(0, &[vec![0; 41]]).is_err());
        assert!(KeyWindow::parse(0, &[k.clone(), k.clone(), k.clone(), k.clone()]).is_err());
        let w = KeyWindow::parse(10, &[vec![1; 42], vec![2; 42], vec![3; 42]]).unwrap().unwrap();
        assert_eq!(w.key_for_epoch(9), None);
        assert_eq!(w.key_for_epoch(10).unwrap().0[0], 1);
        assert_eq!(w.key_for_epoch(12).unwrap().0[0], 3);
        assert_eq!(w.key_for_epoch(13), None);
        assert_eq!(w.key_for_epoch(i64::MIN), None);
    }

    #[test]
    fn duplicate_topics_are_refused() {
        let t = Topic::parse(&[0, 1]).unwrap();
        let sub = Subscription { topic: t.clone(), keys: None, include_commits: false };
        assert!(SubscriptionUpdate::new(vec![sub.clone()], vec![t.clone()]).is_err());
        assert!(SubscriptionUpdate::new(vec![sub.clone(), sub.clone()], vec![]).is_err());
        assert!(SubscriptionUpdate::new(vec![], vec![t.clone(), t.clone()]).is_err());
        assert!(SubscriptionUpdate::new(vec![sub], vec![Topic::parse(&[1, 1]).unwrap()]).is_ok());
    }

    /// A subscription as a client sends it, property-tested.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Keys mostly of the right length, sometimes not.
        fn keys() -> impl Strategy<Value = Vec<Vec<u8>>> {
            let key = prop_oneof![
                4 => prop::collection::vec(any::<u8>(), HMAC_KEY_LEN),
                1 => prop::collection::vec(any::<u8>(), 0..50),
            ];
            prop::collection::vec(key, 0..6)
        }

        proptest! {
            /// PUSH-215's key rules and nothing else decide; an accepted
            /// window answers for exactly the epochs it covers, for any epoch.
            #[test]
            fn key_windows_follow_the_rule(
                base in prop_oneof![any::<i64>(), Just(i64::MAX), Just(i64::MIN), -2i64..3],
                keys in keys(),
                epoch: i64,
            ) {
                let well_formed = keys.len() <= MAX_HMAC_KEYS && keys.iter().all(|k| k.len() == HMAC_KEY_LEN);
                match KeyWindow::parse(base, &keys) {
                    Ok(None) => prop_assert!(keys.is_empty()),
                    Ok(Some(window)) => {
                        prop_assert!(well_formed && !keys.is_empty() && base >= 0);
                        prop_assert_eq!(window.epoch_base(), base);
                        let stored: Vec<&[u8]> = window.keys().iter().map(|k| &k.0[..]).collect();
                        let given: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
                        prop_assert_eq!(stored, given);
                        let expected = i128::from(epoch) - i128::from(base);
                        let want = usize::try_from(expected).ok().and_then(|i| keys.get(i));
                        prop_assert_eq!(window.key_for_epoch(epoch).map(|k| &k.0[..]), want.map(Vec::as_slice));
                        for (i, key) in keys.iter().enumerate() {
                            if let Some(epoch) = base.checked_add(i as i64) {
                                prop_assert_eq!(&window.key_for_epoch(epoch).unwrap().0[..], &key[..]);
                            }
                        }
                    }
                    Err(_) => prop_assert!(!well_formed || (!keys.is_empty() && base < 0)),
                }
            }

            /// A topic may appear once across adds and removes; otherwise the
            /// update is exactly what was sent.
            #[test]
            fn updates_refuse_exactly_the_repeated_topics(
                adds in prop::collection::vec((0u8..2, 1u8..6), 0..6),
                removes in prop::collection::vec((0u8..2, 1u8..6), 0..6),
            ) {
                let topic = |(kind, id): (u8, u8)| Topic::parse(&[kind, id]).unwrap();
                let sub = |t: &(u8, u8)| Subscription { topic: topic(*t), keys: None, include_commits: false };
                let subs: Vec<Subscription> = adds.iter().map(sub).collect();
                let removed: Vec<Topic> = removes.iter().map(|t| topic(*t)).collect();
                let all: Vec<&(u8, u8)> = adds.iter().chain(removes.iter()).collect();
                let distinct: std::collections::HashSet<_> = all.iter().collect();
                match SubscriptionUpdate::new(subs.clone(), removed.clone()) {
                    Ok(update) => {
                        prop_assert_eq!(distinct.len(), all.len());
                        prop_assert_eq!(update.adds, subs);
                        prop_assert_eq!(update.removes, removed);
                    }
                    Err(_) => prop_assert!(distinct.len() < all.len()),
                }
            }
        }
    }
}
