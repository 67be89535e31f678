//! Throwaway PKI for mocks and harness clients: one self-signed CA and one
//! server certificate it signed. Generated in memory with rcgen (ring backend);
//! the engine under test trusts the CA through a PEM file (`write_ca`).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// ALPN id of HTTP/2.
pub const ALPN_H2: &[u8] = b"h2";
/// ALPN id of HTTP/1.1.
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

/// The CA file inside a PKI directory (`load_or_generate`).
pub const CA_FILE: &str = "ca.pem";

/// Names every server certificate covers, before the caller's extra DNS names.
const DEFAULT_SANS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// A CA and a server certificate signed by it. Cheap to clone.
#[derive(Clone)]
pub struct TestPki {
    ca_pem: String,
    ca_der: CertificateDer<'static>,
    server_cert_der: CertificateDer<'static>,
    server_key_der: Arc<PrivatePkcs8KeyDer<'static>>,
}

impl TestPki {
    /// Generates a fresh CA and a server certificate for `localhost`,
    /// `127.0.0.1`, `::1` and `extra_dns_names`.
    pub fn generate(extra_dns_names: &[&str]) -> anyhow::Result<TestPki> {
        // CA: self-signed, may sign certificates. rcgen's default validity
        // (1975..4096) is fine for a test CA.
        let ca_key = KeyPair::generate().context("generating CA key")?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.distinguished_name = rcgen::DistinguishedName::new();
        ca_params.distinguished_name.push(DnType::CommonName, "fanout-testkit test CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca_cert = ca_params.self_signed(&ca_key).context("self-signing CA certificate")?;
        let issuer = Issuer::new(ca_params, ca_key);

        // Server leaf: IP-looking names become IP SANs, the rest DNS SANs.
        let sans: Vec<String> = DEFAULT_SANS.iter().chain(extra_dns_names).map(|s| s.to_string()).collect();
        let server_key = KeyPair::generate().context("generating server key")?;
        let mut server_params = CertificateParams::new(sans).context("invalid server certificate name")?;
        server_params.distinguished_name = rcgen::DistinguishedName::new();
        server_params.distinguished_name.push(DnType::CommonName, "localhost");
        server_params.is_ca = IsCa::ExplicitNoCa;
        server_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        server_params.use_authority_key_identifier_extension = true;
        let server_cert = server_params.signed_by(&server_key, &issuer).context("signing server certificate")?;

        let pki = TestPki {
            ca_pem: ca_cert.pem(),
            ca_der: ca_cert.der().clone(),
            server_cert_der: server_cert.der().clone(),
            server_key_der: Arc::new(PrivatePkcs8KeyDer::from(server_key.serialize_der())),
        };
        // Build both configs once so the infallible accessors below can rely on it.
        pki.try_server_config(&[])?;
        pki.try_client_config()?;
        Ok(pki)
    }

    /// Loads the PKI kept in `dir` by an earlier call, or generates one and
    /// keeps it there. An engine started once with `dir/ca.pem` in its
    /// `extra_ca_files` then trusts every later harness run's mocks.
    pub fn load_or_generate(dir: &Path) -> anyhow::Result<TestPki> {
        let (ca, cert, key) = (dir.join(CA_FILE), dir.join("server-cert.der"), dir.join("server-key.der"));
        if ca.exists() && cert.exists() && key.exists() {
            let ca_pem = std::fs::read_to_string(&ca).with_context(|| format!("reading {}", ca.display()))?;
            let ca_der = rustls_pemfile::certs(&mut ca_pem.as_bytes())
                .next()
                .context("no certificate in ca.pem")?
                .context("bad PEM in ca.pem")?;
            let pki = TestPki {
                ca_pem,
                ca_der,
                server_cert_der: CertificateDer::from(std::fs::read(&cert)?),
                server_key_der: Arc::new(PrivatePkcs8KeyDer::from(std::fs::read(&key)?)),
            };
            pki.try_server_config(&[])?;
            pki.try_client_config()?;
            return Ok(pki);
        }
        let pki = TestPki::generate(&[])?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        pki.write_ca(&ca)?;
        std::fs::write(&cert, pki.server_cert_der.as_ref())?;
        std::fs::write(&key, pki.server_key_der.secret_pkcs8_der())?;
        Ok(pki)
    }

    /// The CA certificate, PEM encoded.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The server certificate and then the CA, PEM encoded: the chain a
    /// server outside this process presents (the harness's Pushy server).
    pub fn server_cert_chain_pem(&self) -> String {
        pem("CERTIFICATE", &self.server_cert_der) + &self.ca_pem
    }

    /// The server certificate's private key, PEM PKCS#8 (`PRIVATE KEY`).
    pub fn server_key_pkcs8_pem(&self) -> String {
        pem("PRIVATE KEY", self.server_key_der.secret_pkcs8_der())
    }

    /// Writes the CA certificate as PEM to `path` (the engine's extra-roots file).
    pub fn write_ca(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(path, &self.ca_pem).with_context(|| format!("writing CA certificate to {}", path.display()))
    }

    /// A server config presenting the server certificate and offering `alpn`
    /// (e.g. `&[ALPN_H2, ALPN_HTTP1]`; empty means no ALPN).
    pub fn server_config(&self, alpn: &[&[u8]]) -> Arc<ServerConfig> {
        Arc::new(self.try_server_config(alpn).expect("server config was validated in TestPki::generate"))
    }

    /// A client config trusting only the CA, offering ALPN h2 and http/1.1.
    ///
    /// hyper-rustls sets ALPN itself and rejects a config that has it: clear
    /// `alpn_protocols` on a clone before `HttpsConnectorBuilder::with_tls_config`.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        Arc::new(self.try_client_config().expect("client config was validated in TestPki::generate"))
    }

    fn try_server_config(&self, alpn: &[&[u8]]) -> anyhow::Result<ServerConfig> {
        let mut config = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![self.server_cert_der.clone()], PrivateKeyDer::Pkcs8(self.server_key_der.clone_key()))
            .context("building rustls server config")?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(config)
    }

    fn try_client_config(&self) -> anyhow::Result<ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(self.ca_der.clone()).context("adding CA to root store")?;
        let mut config = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_HTTP1.to_vec()];
        Ok(config)
    }
}

/// RFC 7468 text encoding: base64 in lines of 64 between the labels.
pub(crate) fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in body.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        out.push('\n');
    }
    out + &format!("-----END {label}-----\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_pki_is_loaded_again() {
        let dir = tempfile::tempdir().unwrap();
        let first = TestPki::load_or_generate(dir.path()).unwrap();
        let second = TestPki::load_or_generate(dir.path()).unwrap();
        assert_eq!(first.ca_pem(), second.ca_pem());
        assert_eq!(first.server_cert_der, second.server_cert_der);
    }

    #[test]
    fn generates_pem_and_configs() {
        let pki = TestPki::generate(&["mock.example"]).unwrap();
        assert!(pki.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        let server = pki.server_config(&[ALPN_H2]);
        assert_eq!(server.alpn_protocols, vec![b"h2".to_vec()]);
        let client = pki.client_config();
        assert_eq!(client.alpn_protocols.len(), 2);
    }

    #[test]
    fn server_chain_and_key_as_pem() {
        let pki = TestPki::generate(&[]).unwrap();
        let chain = pki.server_cert_chain_pem();
        let certs: Vec<_> = rustls_pemfile::certs(&mut chain.as_bytes()).collect::<Result<_, _>>().unwrap();
        assert_eq!(certs, vec![pki.server_cert_der.clone(), pki.ca_der.clone()]);
        let key = pki.server_key_pkcs8_pem();
        assert!(key.starts_with("-----BEGIN PRIVATE KEY-----\n") && key.lines().all(|l| l.len() <= 64));
        let parsed = rustls_pemfile::pkcs8_private_keys(&mut key.as_bytes()).next().unwrap().unwrap();
        assert_eq!(parsed.secret_pkcs8_der(), pki.server_key_der.secret_pkcs8_der());
    }

    #[test]
    fn writes_ca_file() {
        let pki = TestPki::generate(&[]).unwrap();
        let path = std::env::temp_dir().join(format!("fanout-testkit-ca-{}.pem", std::process::id()));
        pki.write_ca(&path).unwrap();
        let written = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(written, pki.ca_pem());
    }
}
