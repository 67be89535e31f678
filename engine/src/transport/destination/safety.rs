//! Webhook destination safety (PUSH-256): the allowed_domains match, and the blocked address table of spec 000 section 2.
//!
//! Error messages name the rule that failed and never the URL, host or
//! address (PUSH-254).

use std::net::IpAddr;

use serde::Deserialize;

use super::blocked::AddressRules;
use super::resolve::{HostResolver, ResolveError};
pub use crate::domain::WebhookUrl;
use crate::domain::is_host_name;

/// Why a webhook destination was refused at its address check (the URL's
/// own rules are `UrlError`'s, at registration). Messages name the rule only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SafetyError {
    #[error("webhook host matches no entry of allowed_domains")]
    DomainNotAllowed,
    /// NXDOMAIN, or no A/AAAA record. Says the same as `BlockedAddress`, so
    /// that a caller cannot tell an internal name from a missing one.
    #[error("webhook host does not resolve to an allowed address")]
    NoAddress,
    #[error("webhook host does not resolve to an allowed address")]
    BlockedAddress,
    /// The lookup itself failed (timeout, SERVFAIL, no resolver): nothing is
    /// known about the host yet, so this is worth trying again (transient at
    /// send, UNAVAILABLE at Register).
    #[error("webhook host cannot be resolved right now")]
    DnsUnavailable,
}

impl SafetyError {
    /// Whether the same check may pass later without any change.
    pub fn is_temporary(&self) -> bool {
        matches!(self, Self::DnsUnavailable)
    }
}

/// An allowed_domains entry (spec 000 section 2): an exact host, or `*.suffix`
/// matching a host that ends with `.suffix` after at least one label. The
/// match is case-insensitive on the host name alone; one trailing dot on
/// either side is ignored.
/// Deserialized from its text, so `allowed_domains` is checked at load.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum DomainPattern {
    Exact(String),
    /// The text after `*.`, lowercased.
    Wildcard(String),
}

impl DomainPattern {
    /// The error names the rule, not the entry.
    pub fn parse(entry: &str) -> Result<Self, &'static str> {
        if entry.is_empty() {
            return Err("must not be empty");
        }
        let lower = entry.to_ascii_lowercase();
        let (wildcard, name) = match lower.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, lower.as_str()),
        };
        if !is_host_name(name) {
            return Err("must be a host name or *. followed by a host name");
        }
        let name = name.strip_suffix('.').unwrap_or(name).to_owned();
        Ok(if wildcard { Self::Wildcard(name) } else { Self::Exact(name) })
    }

    pub fn matches(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        let host = host.strip_suffix('.').unwrap_or(&host);
        match self {
            Self::Exact(name) => host == name,
            Self::Wildcard(suffix) => {
                let Some(prefix) = host.strip_suffix(suffix.as_str()).and_then(|p| p.strip_suffix('.')) else {
                    return false;
                };
                !prefix.is_empty() && prefix.split('.').all(|label| !label.is_empty())
            }
        }
    }
}

impl TryFrom<String> for DomainPattern {
    type Error = &'static str;

    fn try_from(entry: String) -> Result<Self, Self::Error> {
        Self::parse(&entry)
    }
}

/// The operator's webhook settings that bind at registration and again at
/// every attempt (PUSH-256).
#[derive(Debug, Clone, Default)]
pub struct WebhookPolicy {
    pub allowed_domains: Vec<DomainPattern>,
    /// Development and test only: skip the blocked address table.
    pub allow_private_addresses: bool,
    /// Skip the reserved classes beyond the spec's table (see `blocked`).
    pub allow_reserved_addresses: bool,
}

impl WebhookPolicy {
    /// True when allowed_domains is empty or an entry matches. An IP literal
    /// never matches a non-empty list.
    pub fn host_allowed(&self, host: &str) -> bool {
        if self.allowed_domains.is_empty() {
            return true;
        }
        if parse_ip_host(host).is_some() {
            return false;
        }
        self.allowed_domains.iter().any(|p| p.matches(host))
    }

    /// The full PUSH-256 destination check for a URL: allowed_domains, then
    /// resolution (an IP literal is its own single address, no DNS), then the
    /// blocked address table unless allow_private_addresses. Returns the
    /// addresses checked, which are the only ones a connection may use.
    pub async fn check(&self, url: &WebhookUrl, resolver: &dyn HostResolver) -> Result<Vec<IpAddr>, SafetyError> {
        self.check_host(url.host(), resolver).await
    }

    /// `check` for a bare host (a name or an IP literal, IPv6 with or without
    /// brackets). The connector (`CheckedResolver`) uses this at connect time.
    pub async fn check_host(&self, host: &str, resolver: &dyn HostResolver) -> Result<Vec<IpAddr>, SafetyError> {
        if !self.host_allowed(host) {
            return Err(SafetyError::DomainNotAllowed);
        }
        let addrs = match parse_ip_host(host) {
            Some(ip) => vec![ip],
            None => match resolver.resolve(host).await {
                Ok(addrs) => addrs,
                // "No such name" and "no address" are answers about the host.
                Err(ResolveError::NoRecords | ResolveError::InvalidName) => Vec::new(),
                // A lookup that failed says nothing about it.
                Err(ResolveError::Timeout | ResolveError::Failed | ResolveError::Config(_)) => {
                    return Err(SafetyError::DnsUnavailable);
                }
            },
        };
        self.check_addresses(&addrs)?;
        Ok(addrs)
    }

    /// The address part of the check: at least one address, and none that
    /// `AddressRules` blocks (the spec's table while allow_private_addresses
    /// is false, the reserved classes while allow_reserved_addresses is).
    pub fn check_addresses(&self, addrs: &[IpAddr]) -> Result<(), SafetyError> {
        if addrs.is_empty() {
            return Err(SafetyError::NoAddress);
        }
        let rules = AddressRules {
            allow_private_addresses: self.allow_private_addresses,
            allow_reserved_addresses: self.allow_reserved_addresses,
        };
        if addrs.iter().any(|ip| rules.blocks(*ip)) {
            return Err(SafetyError::BlockedAddress);
        }
        Ok(())
    }
}

/// An IP literal host, IPv6 with or without brackets.
fn parse_ip_host(host: &str) -> Option<IpAddr> {
    let inner = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    inner.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::destination::resolve::ResolveError;
    use std::collections::HashMap;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn domain_patterns() {
        let p = DomainPattern::parse("*.example.com").unwrap();
        assert!(p.matches("a.example.com"));
        assert!(p.matches("A.B.Example.COM"));
        assert!(p.matches("a.example.com."));
        assert!(!p.matches("example.com"));
        assert!(!p.matches(".example.com"));
        assert!(!p.matches("badexample.com"));
        assert!(!p.matches("a..example.com"));
        assert!(!p.matches("a.example.com.evil"));

        let p = DomainPattern::parse("Hooks.Example.com").unwrap();
        assert!(p.matches("hooks.example.com"));
        assert!(p.matches("HOOKS.EXAMPLE.COM"));
        assert!(!p.matches("a.hooks.example.com"));
        assert!(!p.matches("hooks.example.co"));

        for bad in [
            "",
            "*",
            "*.",
            ".example.com",
            "a.*.com",
            "*example.com",
            "example.com:443",
            "10.0.0.1",
            "exa mple.com",
            "**.x.com",
        ] {
            assert!(DomainPattern::parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn host_allowed_rules() {
        let open = WebhookPolicy::default();
        assert!(open.host_allowed("anything.example"));
        assert!(open.host_allowed("127.0.0.1"));

        let policy = WebhookPolicy {
            allowed_domains: vec![
                DomainPattern::parse("*.example.com").unwrap(),
                DomainPattern::parse("hooks.test").unwrap(),
            ],
            allow_private_addresses: false,
            allow_reserved_addresses: false,
        };
        assert!(policy.host_allowed("x.example.com"));
        assert!(policy.host_allowed("HOOKS.test"));
        assert!(!policy.host_allowed("example.com"));
        assert!(!policy.host_allowed("93.184.216.34"));
        assert!(!policy.host_allowed("::1"));
        assert!(!policy.host_allowed("[2001:db8::1]"));
    }

    /// An in-memory resolver: names absent from the map fail like NXDOMAIN.
    struct FakeResolver(HashMap<String, Vec<IpAddr>>);

    #[async_trait::async_trait]
    impl HostResolver for FakeResolver {
        async fn resolve(&self, host: &str) -> Result<Vec<IpAddr>, ResolveError> {
            match host {
                "timeout.example.com" => Err(ResolveError::Timeout),
                "servfail.example.com" => Err(ResolveError::Failed),
                _ => self.0.get(host).cloned().ok_or(ResolveError::NoRecords),
            }
        }
    }

    fn fake() -> FakeResolver {
        let zone = [
            ("public.example.com", vec!["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"]),
            ("private.example.com", vec!["10.0.0.1"]),
            ("mapped.example.com", vec!["::ffff:127.0.0.1"]),
            ("mixed.example.com", vec!["93.184.216.34", "192.168.1.1"]),
            ("empty.example.com", vec![]),
            ("other.test", vec!["93.184.216.34"]),
            ("benchmark.example.com", vec!["93.184.216.34", "198.18.0.1"]),
            ("teredo.example.com", vec!["2001:0:4136:e378:8000:63bf:3fff:fdd2"]),
            ("nat64private.example.com", vec!["64:ff9b::10.0.0.1"]),
            ("nat64public.example.com", vec!["64:ff9b::93.184.216.34"]),
        ];
        FakeResolver(zone.into_iter().map(|(n, a)| (n.to_owned(), a.into_iter().map(ip).collect())).collect())
    }

    async fn check(policy: &WebhookPolicy, url: &str) -> Result<Vec<IpAddr>, SafetyError> {
        policy.check(&WebhookUrl::parse(url).unwrap(), &fake()).await
    }

    #[tokio::test]
    async fn policy_check() {
        let policy = WebhookPolicy::default();
        assert_eq!(check(&policy, "https://public.example.com/").await.unwrap().len(), 2);
        assert_eq!(check(&policy, "https://Public.Example.com/").await.unwrap().len(), 2);
        assert_eq!(check(&policy, "https://private.example.com/").await, Err(SafetyError::BlockedAddress));
        assert_eq!(check(&policy, "https://mapped.example.com/").await, Err(SafetyError::BlockedAddress));
        assert_eq!(check(&policy, "https://mixed.example.com/").await, Err(SafetyError::BlockedAddress));
        assert_eq!(check(&policy, "https://empty.example.com/").await, Err(SafetyError::NoAddress));
        assert_eq!(check(&policy, "https://unknown.example.com/").await, Err(SafetyError::NoAddress));
        // IP literals are their own address; no DNS.
        assert_eq!(check(&policy, "https://93.184.216.34/").await, Ok(vec![ip("93.184.216.34")]));
        assert_eq!(check(&policy, "https://127.0.0.1:8443/").await, Err(SafetyError::BlockedAddress));
        assert_eq!(check(&policy, "https://[::ffff:10.0.0.1]/").await, Err(SafetyError::BlockedAddress));
        assert_eq!(check(&policy, "https://[fe80::1]/").await, Err(SafetyError::BlockedAddress));
    }

    #[tokio::test]
    async fn policy_check_reserved_classes() {
        let default = WebhookPolicy::default();
        let private_allowed = WebhookPolicy { allow_private_addresses: true, ..WebhookPolicy::default() };
        let reserved_allowed = WebhookPolicy { allow_reserved_addresses: true, ..WebhookPolicy::default() };
        for policy in [&default, &private_allowed] {
            for url in ["https://benchmark.example.com/", "https://teredo.example.com/", "https://[2001:db8::1]/"] {
                assert_eq!(check(policy, url).await, Err(SafetyError::BlockedAddress), "{url} {policy:?}");
            }
            assert_eq!(check(policy, "https://203.0.113.9/").await, Err(SafetyError::BlockedAddress));
            assert!(check(policy, "https://nat64public.example.com/").await.is_ok());
        }
        assert_eq!(check(&default, "https://nat64private.example.com/").await, Err(SafetyError::BlockedAddress));
        assert!(check(&private_allowed, "https://nat64private.example.com/").await.is_ok());
        // With the reserved classes lifted, only the spec's table is left.
        assert_eq!(check(&reserved_allowed, "https://benchmark.example.com/").await.unwrap().len(), 2);
        assert!(check(&reserved_allowed, "https://[2001:db8::1]/").await.is_ok());
        assert_eq!(check(&reserved_allowed, "https://private.example.com/").await, Err(SafetyError::BlockedAddress));
    }

    #[tokio::test]
    async fn a_failed_lookup_is_temporary_and_says_nothing_of_the_host() {
        let policy = WebhookPolicy::default();
        for host in ["timeout.example.com", "servfail.example.com"] {
            let err = check(&policy, &format!("https://{host}/")).await.unwrap_err();
            assert_eq!(err, SafetyError::DnsUnavailable);
            assert!(err.is_temporary());
        }
        // No address and a blocked address are final, and read the same.
        let none = check(&policy, "https://unknown.example.com/").await.unwrap_err();
        let blocked = check(&policy, "https://private.example.com/").await.unwrap_err();
        assert!(!none.is_temporary() && !blocked.is_temporary());
        assert_eq!(none.to_string(), blocked.to_string());
    }

    #[tokio::test]
    async fn policy_check_private_allowed() {
        let policy = WebhookPolicy { allow_private_addresses: true, ..WebhookPolicy::default() };
        assert_eq!(check(&policy, "https://private.example.com/").await, Ok(vec![ip("10.0.0.1")]));
        assert_eq!(check(&policy, "https://mixed.example.com/").await.unwrap().len(), 2);
        assert_eq!(check(&policy, "https://127.0.0.1/").await, Ok(vec![ip("127.0.0.1")]));
        // Still no address is still refused.
        assert_eq!(check(&policy, "https://empty.example.com/").await, Err(SafetyError::NoAddress));
    }

    #[tokio::test]
    async fn policy_check_allowed_domains() {
        let policy = WebhookPolicy {
            allowed_domains: vec![DomainPattern::parse("*.example.com").unwrap()],
            allow_private_addresses: false,
            allow_reserved_addresses: false,
        };
        assert!(check(&policy, "https://public.example.com/").await.is_ok());
        assert_eq!(check(&policy, "https://other.test/").await, Err(SafetyError::DomainNotAllowed));
        assert_eq!(check(&policy, "https://93.184.216.34/").await, Err(SafetyError::DomainNotAllowed));
        // The domain rule comes first, then the address rule.
        assert_eq!(check(&policy, "https://private.example.com/").await, Err(SafetyError::BlockedAddress));
    }

    #[test]
    fn messages_name_the_rule_only() {
        for e in [SafetyError::DomainNotAllowed, SafetyError::NoAddress, SafetyError::BlockedAddress] {
            assert!(e.to_string().starts_with("webhook "));
        }
    }

    /// Webhook URLs and allowed_domains entries, property-tested.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn label() -> impl Strategy<Value = String> {
            "[a-zA-Z0-9_]([a-zA-Z0-9_-]{0,8}[a-zA-Z0-9_])?"
        }

        /// A host name whose last label is not all digits.
        fn host_name() -> impl Strategy<Value = String> {
            (prop::collection::vec(label(), 0..4), "[a-z][a-z0-9]{0,6}")
                .prop_map(|(labels, tld)| labels.into_iter().chain([tld]).collect::<Vec<_>>().join("."))
        }

        proptest! {
            /// Any text: parsed or refused, never a panic; what parses is an
            /// https URL without user info, kept exactly as given, whose Debug
            /// shows nothing of it.
            #[test]
            fn any_text_parses_or_is_refused(text in "\\PC{0,60}|https://[\\PC&&[^/]]{0,30}(/\\PC{0,10})?") {
                if let Ok(url) = WebhookUrl::parse(&text) {
                    prop_assert!(text.get(..8).is_some_and(|s| s.eq_ignore_ascii_case("https://")));
                    prop_assert_eq!(url.as_str(), text.as_str());
                    prop_assert!(url.port() != 0);
                    prop_assert!(!url.host().is_empty());
                    prop_assert!(!url.uri().authority().unwrap().as_str().contains('@'));
                    prop_assert_eq!(format!("{url:?}"), "WebhookUrl(..)");
                }
            }

            /// Round trip: a URL built from a host name (or an IP literal), a
            /// port and a path gives them back.
            #[test]
            fn built_urls_give_back_their_parts(
                name in host_name(),
                ip: std::net::IpAddr,
                literal: bool,
                port in proptest::option::of(1u16..),
                path in "(/[a-zA-Z0-9._~-]{0,8}){0,3}",
            ) {
                let host = match (literal, ip) {
                    (false, _) => name.clone(),
                    (true, IpAddr::V4(v4)) => v4.to_string(),
                    (true, IpAddr::V6(v6)) => format!("[{v6}]"),
                };
                let authority = port.map_or(host.clone(), |p| format!("{host}:{p}"));
                let url = WebhookUrl::parse(&format!("https://{authority}{path}")).unwrap();
                prop_assert_eq!(url.port(), port.unwrap_or(443));
                if literal {
                    prop_assert_eq!(url.ip_literal(), Some(ip));
                    prop_assert_eq!(url.host(), ip.to_string());
                } else {
                    prop_assert_eq!(url.ip_literal(), None);
                    prop_assert_eq!(url.host(), name.to_ascii_lowercase());
                }
            }

            /// Any entry text: parsed or refused; a parsed exact entry matches
            /// its own name in any case, a wildcard one a name one label
            /// deeper but never the bare suffix.
            #[test]
            fn domain_entries_match_what_they_say(entry in "\\PC{0,30}|(\\*\\.)?[a-zA-Z0-9.-]{0,20}", sub in label()) {
                match DomainPattern::parse(&entry) {
                    Ok(DomainPattern::Exact(name)) => {
                        let deeper = format!("{sub}.{name}");
                        prop_assert!(DomainPattern::Exact(name.clone()).matches(&name.to_ascii_uppercase()));
                        prop_assert!(!DomainPattern::Exact(name.clone()).matches(&deeper));
                    }
                    Ok(DomainPattern::Wildcard(suffix)) => {
                        let deeper = format!("{sub}.{suffix}");
                        let p = DomainPattern::Wildcard(suffix.clone());
                        prop_assert!(p.matches(&deeper));
                        prop_assert!(!p.matches(&suffix));
                    }
                    Err(rule) => prop_assert!(!rule.is_empty()),
                }
            }
        }
    }
}
