//! A device's push route for the relay channel (spec 003 §1): the
//! registration the hub passes, as stored, to the operator's push server.
//! Every field is opaque to fanout: only its shape is checked here.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// The provider name of the hub's own test provider (003 §5): its pushes
/// never reach the webhook.
pub const LOG_PROVIDER: &str = "log";

/// Why a registration field was refused: the field's name and the rule, never
/// the value (PUSH-254). Shown as `400 validation_failed` over HTTP and
/// `INVALID_ARGUMENT` over gRPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{rule}")]
pub struct FieldError {
    pub field: &'static str,
    pub rule: &'static str,
}

impl FieldError {
    const fn new(field: &'static str, rule: &'static str) -> Self {
        Self { field, rule }
    }
}

/// A registration as received, before the §1 rules.
#[derive(Debug, Clone, Copy, Default)]
pub struct RegistrationInput<'a> {
    pub provider: &'a str,
    pub token: &'a str,
    pub app_id: Option<&'a str>,
    pub sandbox: Option<bool>,
    pub p256dh: Option<&'a str>,
    pub auth: Option<&'a str>,
}

/// A registration that passed every rule of 003 §1. `p256dh` and `auth` are
/// kept as unpadded base64url (§2.3 re-encodes them so), which makes two
/// registrations that differ only in padding equal. Debug hides the token.
#[derive(Clone, PartialEq, Eq)]
pub struct RelayRegistration {
    provider: String,
    token: String,
    app_id: Option<String>,
    sandbox: Option<bool>,
    p256dh: Option<String>,
    auth: Option<String>,
}

impl RelayRegistration {
    /// Every rule of the §1 table, in field order; the first failure names its field.
    pub fn parse(input: RegistrationInput<'_>) -> Result<Self, FieldError> {
        let provider = input.provider;
        if !(1..=64).contains(&provider.len())
            || !provider.bytes().all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-'))
        {
            return Err(FieldError::new("provider", "provider must be 1 to 64 characters of a-z 0-9 . _ -"));
        }
        let token = input.token;
        if !(1..=4096).contains(&token.len()) || token.chars().any(char::is_control) {
            return Err(FieldError::new("token", "token must be 1 to 4096 bytes with no control characters"));
        }
        if let Some(app_id) = input.app_id
            && (!(1..=255).contains(&app_id.len())
                || !app_id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':')))
        {
            return Err(FieldError::new("app_id", "app_id must be 1 to 255 characters of A-Z a-z 0-9 . - _ :"));
        }
        let p256dh = input
            .p256dh
            .map(|k| {
                web_push_key(k).ok_or(FieldError::new("p256dh", "p256dh must be 1 to 256 characters of base64url"))
            })
            .transpose()?;
        let auth = input
            .auth
            .map(|k| web_push_key(k).ok_or(FieldError::new("auth", "auth must be 1 to 256 characters of base64url")))
            .transpose()?;
        Ok(Self {
            provider: provider.to_owned(),
            token: token.to_owned(),
            app_id: input.app_id.map(str::to_owned),
            sandbox: input.sandbox,
            p256dh,
            auth,
        })
    }

    pub fn provider(&self) -> &str {
        &self.provider
    }
    pub fn token(&self) -> &str {
        &self.token
    }
    pub fn app_id(&self) -> Option<&str> {
        self.app_id.as_deref()
    }
    pub fn sandbox(&self) -> Option<bool> {
        self.sandbox
    }
    /// Unpadded base64url.
    pub fn p256dh(&self) -> Option<&str> {
        self.p256dh.as_deref()
    }
    /// Unpadded base64url.
    pub fn auth(&self) -> Option<&str> {
        self.auth.as_deref()
    }

    /// Provider `log`: the hub's test provider (003 §5).
    pub fn is_log(&self) -> bool {
        self.provider == LOG_PROVIDER
    }
}

impl std::fmt::Debug for RelayRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The provider name is a bounded, public value; the rest is private.
        write!(f, "RelayRegistration({}, ..)", self.provider)
    }
}

/// 1 to 256 characters of base64url, padding optional (§1), that decode;
/// returned without padding. `+` and `/` (standard base64) are refused.
fn web_push_key(key: &str) -> Option<String> {
    if !(1..=256).contains(&key.len()) {
        return None;
    }
    let unpadded = key.trim_end_matches('=');
    let ok = !unpadded.is_empty()
        && unpadded.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
        && key.len() - unpadded.len() <= 2
        && URL_SAFE_NO_PAD.decode(unpadded).is_ok();
    ok.then(|| unpadded.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> RegistrationInput<'static> {
        RegistrationInput { provider: "apns", token: "tok", ..RegistrationInput::default() }
    }

    fn refused(input: RegistrationInput<'_>) -> &'static str {
        RelayRegistration::parse(input).expect_err("must be refused").field
    }

    #[test]
    fn the_rules_of_section_1() {
        let ok = RelayRegistration::parse(RegistrationInput {
            app_id: Some("im.g.apps:x-y_z"),
            sandbox: Some(false),
            p256dh: Some("BNcRdreALRFXTkOOUHK1EtK2wtaz5Ry4YfYCA_0QTpQtUbVlUls0VJXg7A8u-Ts1XbjhazAkj7I99e8QcYP7DkM="),
            auth: Some("tBHItJI5svbpez7KI4CCXg=="),
            ..base()
        })
        .unwrap();
        assert_eq!(ok.auth(), Some("tBHItJI5svbpez7KI4CCXg"), "re-encoded unpadded");
        assert!(!ok.p256dh().unwrap().ends_with('='));
        assert_eq!(ok.sandbox(), Some(false));
        assert!(RelayRegistration::parse(RegistrationInput { provider: &"a".repeat(64), ..base() }).is_ok());
        assert!(RelayRegistration::parse(RegistrationInput { provider: "unified.push_x-1", ..base() }).is_ok());
        let long_token = "é".repeat(2048); // 4096 bytes
        assert!(RelayRegistration::parse(RegistrationInput { token: &long_token, ..base() }).is_ok());
        assert!(RelayRegistration::parse(RegistrationInput { app_id: Some(&"a".repeat(255)), ..base() }).is_ok());
        assert!(RelayRegistration::parse(RegistrationInput { p256dh: Some(&"A".repeat(256)), ..base() }).is_ok());
        assert!(RelayRegistration::parse(RegistrationInput { provider: "log", ..base() }).unwrap().is_log());
    }

    #[test]
    fn the_negative_cases_of_the_checklist_name_their_field() {
        let long_provider = "a".repeat(65);
        for provider in ["", long_provider.as_str(), "APNS", "fcm!"] {
            assert_eq!(refused(RegistrationInput { provider, ..base() }), "provider", "{provider:?}");
        }
        let long_token = "a".repeat(4097);
        for token in ["", long_token.as_str(), "a\nb", "a\0b", "a\u{7f}", "a\u{85}"] {
            assert_eq!(refused(RegistrationInput { token, ..base() }), "token", "{token:?}");
        }
        let long_app = "a".repeat(256);
        for app_id in ["", long_app.as_str(), "a b", "a/b"] {
            assert_eq!(refused(RegistrationInput { app_id: Some(app_id), ..base() }), "app_id", "{app_id:?}");
        }
        let long_key = "A".repeat(257);
        for key in ["", long_key.as_str(), "ab+c", "ab/c", "===", "a===", "A"] {
            assert_eq!(refused(RegistrationInput { p256dh: Some(key), ..base() }), "p256dh", "{key:?}");
            assert_eq!(refused(RegistrationInput { auth: Some(key), ..base() }), "auth", "{key:?}");
        }
    }

    #[test]
    fn debug_hides_the_token() {
        let r = RelayRegistration::parse(RegistrationInput { token: "secret-token", ..base() }).unwrap();
        assert!(!format!("{r:?}").contains("secret-token"));
    }

    /// Spec 003 section 1 registrations, property-tested.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn text() -> impl Strategy<Value = String> {
            prop_oneof![
                "[a-z0-9._-]{0,70}",
                "[A-Za-z0-9.:_-]{0,260}",
                "\\PC{0,80}",
                ".{0,20}",
                "[A-Za-z0-9_-]{0,260}={0,3}"
            ]
        }

        /// The model: 1 to 256 characters, base64url that decodes, at most
        /// two `=` of padding.
        fn base64url_key(k: &str) -> bool {
            let unpadded = k.trim_end_matches('=');
            (1..=256).contains(&k.len())
                && k.len() - unpadded.len() <= 2
                && !unpadded.is_empty()
                && unpadded.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && URL_SAFE_NO_PAD.decode(unpadded).is_ok()
        }

        proptest! {
            /// The section 1 table decides, field by field; an accepted
            /// registration holds exactly the fields sent.
            #[test]
            fn registrations_follow_the_table(
                provider in text(), token in text(), app_id in proptest::option::of(text()),
                sandbox: Option<bool>, p256dh in proptest::option::of(text()), auth in proptest::option::of(text()),
            ) {
                let input = RegistrationInput {
                    provider: &provider,
                    token: &token,
                    app_id: app_id.as_deref(),
                    sandbox,
                    p256dh: p256dh.as_deref(),
                    auth: auth.as_deref(),
                };
                let provider_ok = (1..=64).contains(&provider.len())
                    && provider.bytes().all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-'));
                let token_ok = (1..=4096).contains(&token.len()) && !token.chars().any(char::is_control);
                let app_id_ok = app_id.as_deref().is_none_or(|a| {
                    (1..=255).contains(&a.len())
                        && a.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':'))
                });
                let keys_ok = p256dh.as_deref().is_none_or(base64url_key) && auth.as_deref().is_none_or(base64url_key);
                match RelayRegistration::parse(input) {
                    Ok(r) => {
                        prop_assert!(provider_ok && token_ok && app_id_ok && keys_ok);
                        prop_assert_eq!(r.provider(), provider.as_str());
                        prop_assert_eq!(r.token(), token.as_str());
                        prop_assert_eq!(r.app_id(), app_id.as_deref());
                        prop_assert_eq!(r.sandbox(), sandbox);
                        // Web Push keys are kept without their padding.
                        prop_assert_eq!(r.p256dh(), p256dh.as_deref().map(|k| k.trim_end_matches('=')));
                        prop_assert_eq!(r.auth(), auth.as_deref().map(|k| k.trim_end_matches('=')));
                    }
                    Err(e) => {
                        prop_assert!(!(provider_ok && token_ok && app_id_ok && keys_ok));
                        // The first failing field in table order is named.
                        let first = if !provider_ok { "provider" } else if !token_ok { "token" }
                            else if !app_id_ok { "app_id" }
                            else if p256dh.as_deref().is_some_and(|k| !base64url_key(k)) { "p256dh" }
                            else { "auth" };
                        prop_assert_eq!(e.field, first);
                    }
                }
            }
        }
    }
}
