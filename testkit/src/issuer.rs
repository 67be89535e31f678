//! A test certificate authority that keeps its key, for the engine's own
//! listeners: it issues a server certificate for the engine and
//! client certificates with chosen identities (mTLS), written as PEM files
//! the engine's `[server.tls]` reads, and builds the matching rustls client
//! configurations.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore};

/// A certificate and its key, PEM and DER.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    cert_der: CertificateDer<'static>,
    key_der: PrivatePkcs8KeyDer<'static>,
}

impl Issued {
    /// Writes `<stem>.crt` and `<stem>.key` into `dir`; returns their paths.
    pub fn write(&self, dir: &Path, stem: &str) -> anyhow::Result<(std::path::PathBuf, std::path::PathBuf)> {
        let (cert, key) = (dir.join(format!("{stem}.crt")), dir.join(format!("{stem}.key")));
        std::fs::write(&cert, &self.cert_pem).with_context(|| format!("writing {}", cert.display()))?;
        std::fs::write(&key, &self.key_pem).with_context(|| format!("writing {}", key.display()))?;
        Ok((cert, key))
    }
}

pub struct CertIssuer {
    name: String,
    issuer: Issuer<'static, KeyPair>,
    ca_pem: String,
    ca_der: CertificateDer<'static>,
}

impl CertIssuer {
    /// A new self-signed CA called `name`.
    pub fn new(name: &str) -> anyhow::Result<Self> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let cert = params.self_signed(&key)?;
        Ok(Self {
            name: name.to_owned(),
            ca_pem: cert.pem(),
            ca_der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        })
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A server certificate for `localhost` and `127.0.0.1`, common name `cn`.
    pub fn server(&self, cn: &str) -> anyhow::Result<Issued> {
        let mut params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    /// A client certificate with common name `cn` and SAN URIs `uris`.
    pub fn client(&self, cn: &str, uris: &[&str]) -> anyhow::Result<Issued> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        for uri in uris {
            params.subject_alt_names.push(SanType::URI((*uri).try_into().context("SAN URI")?));
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    fn sign(&self, mut params: CertificateParams) -> anyhow::Result<Issued> {
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer).with_context(|| format!("signing with {}", self.name))?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().clone(),
            key_der: PrivatePkcs8KeyDer::from(key.serialize_der()),
        })
    }

    /// A client configuration trusting this CA, offering `alpn`, presenting
    /// `identity` when given.
    pub fn client_config(&self, alpn: &[&[u8]], identity: Option<&Issued>) -> anyhow::Result<Arc<ClientConfig>> {
        let mut roots = RootCertStore::empty();
        roots.add(self.ca_der.clone())?;
        let builder = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        let mut config = match identity {
            None => builder.with_no_client_auth(),
            Some(id) => builder
                .with_client_auth_cert(vec![id.cert_der.clone()], PrivateKeyDer::Pkcs8(id.key_der.clone_key()))?,
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }
}
