//! Who may call what. Three principals: publishers
//! (`PublishService`), recipient clients (`NotificationService`, only when
//! `recipient_required`: spec 000 already authenticates each recipient by
//! its secret) and operators (gRPC reflection, `/metrics`). A caller proves
//! a role with a bearer token (`authorization: Bearer <token>`) or with the
//! identity of a verified client certificate (mTLS).
//!
//! Tokens are never stored: a token file holds one `sha256:<hex>` line per
//! token (`fanout hash-token` prints one), so a leaked file grants nothing.
//! A presented token is hashed once and compared with every stored hash in
//! constant time. The files are read again on SIGHUP or when they change
//! (`tls::watch_files`), so tokens rotate without a restart.
//!
//! No credential, or one nobody issued: UNAUTHENTICATED (HTTP 401). A known
//! credential without the role: PERMISSION_DENIED (HTTP 403). Either way
//! the call changes nothing.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::tls::Reloadable;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, strum::IntoStaticStr)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum Role {
    Publisher,
    Recipient,
    Operator,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// `[server.auth]`. Present, publishers and operators must authenticate.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    /// Role → file of hashed tokens, e.g. `{ publisher = "/etc/fanout/tokens/publisher" }`.
    #[serde(default)]
    pub token_files: BTreeMap<Role, PathBuf>,
    /// Role → client certificate identities granted it: `uri:<SAN URI>`
    /// (e.g. a SPIFFE id), `dns:<SAN DNS name>` or `cn:<subject common name>`.
    /// Needs `[server.tls] client_ca_file`.
    #[serde(default)]
    pub certificate_identities: BTreeMap<Role, Vec<CertificateIdentity>>,
    /// `NotificationService` also needs the recipient role (default false:
    /// spec 000's recipient secret is its authentication).
    #[serde(default)]
    pub recipient_required: bool,
}

/// One identity a verified client certificate can carry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(try_from = "String")]
pub enum CertificateIdentity {
    Uri(String),
    Dns(String),
    CommonName(String),
}

impl TryFrom<String> for CertificateIdentity {
    type Error = &'static str;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        let (kind, value) = s.split_once(':').ok_or("must be uri:<SAN URI>, dns:<SAN DNS name> or cn:<common name>")?;
        if value.is_empty() {
            return Err("the identity after the prefix is empty");
        }
        match kind {
            "uri" => Ok(Self::Uri(value.to_owned())),
            "dns" => Ok(Self::Dns(value.to_ascii_lowercase())),
            "cn" => Ok(Self::CommonName(value.to_owned())),
            _ => Err("must start with uri:, dns: or cn:"),
        }
    }
}

/// What the connection proved: the identities of its verified client
/// certificate (empty without one). Put in every request's extensions.
#[derive(Debug, Clone, Default)]
pub struct Peer {
    pub identities: Vec<CertificateIdentity>,
}

impl Peer {
    /// The identities of a verified leaf certificate (rustls verified the
    /// chain during the handshake; this only reads names).
    pub fn from_certificate(der: &[u8]) -> Peer {
        use x509_parser::extensions::GeneralName;
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
            return Peer::default();
        };
        let mut identities = Vec::new();
        for cn in cert.subject().iter_common_name() {
            if let Ok(cn) = cn.as_str() {
                identities.push(CertificateIdentity::CommonName(cn.to_owned()));
            }
        }
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    GeneralName::URI(uri) => identities.push(CertificateIdentity::Uri((*uri).to_owned())),
                    GeneralName::DNSName(dns) => identities.push(CertificateIdentity::Dns(dns.to_ascii_lowercase())),
                    _ => {}
                }
            }
        }
        Peer { identities }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    #[error("this call needs credentials: a bearer token or a client certificate")]
    Unauthenticated,
    #[error("these credentials do not grant this call")]
    PermissionDenied,
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("server.auth.token_files.{role}: cannot read {path}: {source}")]
    Read { role: &'static str, path: String, source: std::io::Error },
    #[error("server.auth.token_files.{role}: line {line} of {path} is not sha256:<64 hex digits>")]
    Line { role: &'static str, path: String, line: usize },
}

/// The credentials in force. Cheap to share.
pub struct Authenticator {
    settings: AuthSettings,
    tokens: RwLock<Vec<(Role, [u8; 32])>>,
}

impl Authenticator {
    pub fn load(settings: &AuthSettings) -> Result<Arc<Self>, AuthError> {
        let tokens = read_tokens(settings)?;
        Ok(Arc::new(Self { settings: settings.clone(), tokens: RwLock::new(tokens) }))
    }

    pub fn required(&self, role: Role) -> bool {
        match role {
            Role::Publisher | Role::Operator => true,
            Role::Recipient => self.settings.recipient_required,
        }
    }

    /// Checks a call that needs `role`. `authorization` is the header value.
    pub fn check(&self, role: Role, authorization: Option<&str>, peer: Option<&Peer>) -> Result<(), Denied> {
        if !self.required(role) {
            return Ok(());
        }
        let mut known = false;
        if let Some(token) = authorization.and_then(bearer) {
            let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
            let tokens = self.tokens.read().unwrap_or_else(|e| e.into_inner());
            // Every stored hash is compared, whatever matched before.
            let mut granted = subtle::Choice::from(0);
            for (r, hash) in tokens.iter() {
                let equal = hash.ct_eq(&presented);
                known |= bool::from(equal);
                granted |= equal & subtle::Choice::from(u8::from(*r == role));
            }
            if bool::from(granted) {
                return Ok(());
            }
        }
        if let Some(peer) = peer {
            for (r, ids) in &self.settings.certificate_identities {
                if peer.identities.iter().any(|id| ids.contains(id)) {
                    if *r == role {
                        return Ok(());
                    }
                    known = true;
                }
            }
        }
        Err(if known { Denied::PermissionDenied } else { Denied::Unauthenticated })
    }
}

impl Reloadable for Authenticator {
    fn name(&self) -> &'static str {
        "bearer token files"
    }

    fn files(&self) -> Vec<PathBuf> {
        self.settings.token_files.values().cloned().collect()
    }

    fn reload(&self) -> Result<(), String> {
        let tokens = read_tokens(&self.settings).map_err(|e| e.to_string())?;
        *self.tokens.write().unwrap_or_else(|e| e.into_inner()) = tokens;
        Ok(())
    }
}

fn bearer(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim()).filter(|t| !t.is_empty())
}

/// `sha256:<hex>` per line; blank lines and `#` comments ignored; anything
/// after the hash on a line (a name for the token) is a comment too.
fn read_tokens(settings: &AuthSettings) -> Result<Vec<(Role, [u8; 32])>, AuthError> {
    let mut tokens = Vec::new();
    for (role, path) in &settings.token_files {
        let role_name = role.as_str();
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read {
            role: role_name,
            path: path.display().to_string(),
            source,
        })?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let hash = line.split_whitespace().next().and_then(|h| h.strip_prefix("sha256:"));
            let parsed = hash.and_then(|h| <[u8; 32]>::try_from(hex::decode(h).ok()?).ok());
            let hash =
                parsed.ok_or(AuthError::Line { role: role_name, path: path.display().to_string(), line: n + 1 })?;
            tokens.push((*role, hash));
        }
    }
    Ok(tokens)
}

/// The line a token file holds for `token` (`fanout hash-token`).
pub fn hash_line(token: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(token.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn authenticator(recipient_required: bool) -> (tempfile::TempDir, Arc<Authenticator>) {
        let dir = tempfile::tempdir().unwrap();
        let publisher = dir.path().join("publisher");
        let operator = dir.path().join("operator");
        std::fs::write(&publisher, format!("# publishers\n{} ci-publisher\n\n", hash_line("pub-token"))).unwrap();
        std::fs::write(&operator, hash_line("ops-token")).unwrap();
        let settings = AuthSettings {
            token_files: BTreeMap::from([(Role::Publisher, publisher), (Role::Operator, operator)]),
            certificate_identities: BTreeMap::from([(
                Role::Publisher,
                vec![CertificateIdentity::try_from("uri:spiffe://cluster/publisher".to_owned()).unwrap()],
            )]),
            recipient_required,
        };
        let auth = Authenticator::load(&settings).unwrap();
        (dir, auth)
    }

    #[test]
    fn tokens_grant_their_role_only() {
        let (_dir, auth) = authenticator(false);
        assert_eq!(auth.check(Role::Publisher, Some("Bearer pub-token"), None), Ok(()));
        assert_eq!(auth.check(Role::Publisher, Some("bearer  pub-token "), None), Ok(()));
        assert_eq!(auth.check(Role::Operator, Some("Bearer ops-token"), None), Ok(()));
        assert_eq!(auth.check(Role::Operator, Some("Bearer pub-token"), None), Err(Denied::PermissionDenied));
        assert_eq!(auth.check(Role::Publisher, Some("Bearer guess"), None), Err(Denied::Unauthenticated));
        assert_eq!(auth.check(Role::Publisher, Some("Basic pub-token"), None), Err(Denied::Unauthenticated));
        assert_eq!(auth.check(Role::Publisher, None, None), Err(Denied::Unauthenticated));
        // The recipient role is not required unless configured.
        assert_eq!(auth.check(Role::Recipient, None, None), Ok(()));
        let (_dir, strict) = authenticator(true);
        assert_eq!(strict.check(Role::Recipient, None, None), Err(Denied::Unauthenticated));
        assert_eq!(strict.check(Role::Recipient, Some("Bearer pub-token"), None), Err(Denied::PermissionDenied));
    }

    #[test]
    fn certificate_identities_grant_their_role_only() {
        let (_dir, auth) = authenticator(false);
        let peer = Peer { identities: vec![CertificateIdentity::Uri("spiffe://cluster/publisher".into())] };
        assert_eq!(auth.check(Role::Publisher, None, Some(&peer)), Ok(()));
        assert_eq!(auth.check(Role::Operator, None, Some(&peer)), Err(Denied::PermissionDenied));
        let stranger = Peer { identities: vec![CertificateIdentity::CommonName("spiffe://cluster/publisher".into())] };
        assert_eq!(auth.check(Role::Publisher, None, Some(&stranger)), Err(Denied::Unauthenticated));
    }

    #[test]
    fn token_files_are_checked_and_reloaded() {
        let (dir, auth) = authenticator(false);
        std::fs::write(dir.path().join("publisher"), format!("{}\n", hash_line("rotated"))).unwrap();
        auth.reload().unwrap();
        assert_eq!(auth.check(Role::Publisher, Some("Bearer rotated"), None), Ok(()));
        assert_eq!(auth.check(Role::Publisher, Some("Bearer pub-token"), None), Err(Denied::Unauthenticated));
        std::fs::write(dir.path().join("publisher"), "pub-token\n").unwrap();
        let error = auth.reload().unwrap_err();
        assert!(error.contains("server.auth.token_files.publisher: line 1"), "{error}");
        assert_eq!(auth.check(Role::Publisher, Some("Bearer rotated"), None), Ok(()), "a bad file changes nothing");
    }

    #[test]
    fn identities_parse_with_their_prefix() {
        let parse = |s: &str| CertificateIdentity::try_from(s.to_owned());
        assert_eq!(parse("dns:Pub.Example"), Ok(CertificateIdentity::Dns("pub.example".into())));
        assert_eq!(parse("cn:ops"), Ok(CertificateIdentity::CommonName("ops".into())));
        assert!(parse("spiffe://x").is_err());
        assert!(parse("uri:").is_err());
    }

    #[test]
    fn peer_identities_come_from_the_certificate() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["Pub.Example".to_owned()]).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, "ops");
        params.subject_alt_names.push(rcgen::SanType::URI("spiffe://cluster/publisher".try_into().unwrap()));
        let cert = params.self_signed(&key).unwrap();
        let peer = Peer::from_certificate(cert.der());
        assert!(peer.identities.contains(&CertificateIdentity::CommonName("ops".into())));
        assert!(peer.identities.contains(&CertificateIdentity::Dns("pub.example".into())));
        assert!(peer.identities.contains(&CertificateIdentity::Uri("spiffe://cluster/publisher".into())));
    }
}
