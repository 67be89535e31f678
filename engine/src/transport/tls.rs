use std::path::PathBuf;
use std::sync::Arc;

/// A rustls client config trusting the system roots plus `extra_ca_files`
/// (PEM). ALPN (h2, http/1.1) is set by the HTTPS connector that uses it.
pub fn client_tls_config(extra_ca_files: &[PathBuf]) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    // System roots are best effort: a container without them still works with
    // the configured extra roots.
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    for path in extra_ca_files {
        let pem = std::fs::read(path).map_err(|e| format!("cannot read CA file {}: {e}", path.display()))?;
        let mut added = 0;
        for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
            let cert = cert.map_err(|e| format!("bad PEM in CA file {}: {e}", path.display()))?;
            roots.add(cert).map_err(|e| format!("bad CA certificate in {}: {e}", path.display()))?;
            added += 1;
        }
        if added == 0 {
            return Err(format!("no certificate in CA file {}", path.display()));
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}
