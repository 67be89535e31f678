//! Server-side TLS for every listener: `[server.tls]` names the
//! certificate chain and key files and, optionally, a CA whose clients are
//! verified (mTLS). The files are read again on SIGHUP and whenever their
//! modification time changes (checked every `reload_interval_seconds`), so a
//! rotated Kubernetes secret takes effect without a restart; connections
//! already open keep the configuration they were accepted with. A reload
//! that fails (a half-written file) keeps the previous configuration and
//! says so in the log.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use fanout_engine::duration;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use serde::Deserialize;
use tokio::sync::watch;

/// ALPN ids: gRPC is HTTP/2 only; the HTTP listeners speak both.
pub const ALPN_H2: &[u8] = b"h2";
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSettings {
    /// PEM: the server certificate followed by its intermediates.
    pub cert_file: PathBuf,
    /// PEM: the private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// PEM: CAs whose client certificates are verified (mTLS). Absent: no
    /// client certificates are asked for.
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
    /// With `client_ca_file`: refuse a handshake without a client
    /// certificate. Default false: clients may still use bearer tokens.
    #[serde(default)]
    pub client_cert_required: bool,
    /// How often the files' modification times are checked (SIGHUP reloads
    /// at once too).
    #[serde(
        rename = "reload_interval_seconds",
        default = "default_reload_interval",
        deserialize_with = "duration::seconds"
    )]
    pub reload_interval: Duration,
}

fn default_reload_interval() -> Duration {
    Duration::from_secs(60)
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}: {what}")]
    Content { path: String, what: &'static str },
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client CA: {0}")]
    Verifier(String),
}

/// The current server configurations (one per ALPN set), swapped on reload.
pub struct ServerTls {
    settings: TlsSettings,
    grpc: RwLock<Arc<ServerConfig>>,
    http: RwLock<Arc<ServerConfig>>,
}

impl ServerTls {
    /// Reads the files once; an error here stops the start.
    pub fn load(settings: &TlsSettings) -> Result<Arc<Self>, TlsError> {
        let (grpc, http) = build(settings)?;
        Ok(Arc::new(Self { settings: settings.clone(), grpc: RwLock::new(grpc), http: RwLock::new(http) }))
    }

    /// The configuration new gRPC connections are accepted with (ALPN h2).
    pub fn grpc(&self) -> Arc<ServerConfig> {
        self.grpc.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The configuration new HTTP connections are accepted with (h2, http/1.1).
    pub fn http(&self) -> Arc<ServerConfig> {
        self.http.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn reload(&self) -> Result<(), TlsError> {
        let (grpc, http) = build(&self.settings)?;
        *self.grpc.write().unwrap_or_else(|e| e.into_inner()) = grpc;
        *self.http.write().unwrap_or_else(|e| e.into_inner()) = http;
        Ok(())
    }

    pub fn reload_interval(&self) -> Duration {
        self.settings.reload_interval
    }
}

fn build(s: &TlsSettings) -> Result<(Arc<ServerConfig>, Arc<ServerConfig>), TlsError> {
    let chain = certificates(&s.cert_file)?;
    let key = private_key(&s.key_file)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
    let builder = match &s.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(ca)? {
                roots.add(cert)?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if s.client_cert_required { verifier } else { verifier.allow_unauthenticated() };
            builder.with_client_cert_verifier(verifier.build().map_err(|e| TlsError::Verifier(e.to_string()))?)
        }
    };
    let config = builder.with_single_cert(chain, key)?;
    let with_alpn = |alpn: &[&[u8]]| {
        let mut c = config.clone();
        c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(c)
    };
    Ok((with_alpn(&[ALPN_H2]), with_alpn(&[ALPN_H2, ALPN_HTTP1])))
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.display().to_string(), source })
}

/// The certificates of a PEM file; none is an error.
pub(crate) fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| TlsError::Content { path: path.display().to_string(), what: "not valid PEM" })?;
    if certs.is_empty() {
        return Err(TlsError::Content { path: path.display().to_string(), what: "no certificate in the file" });
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(path)?;
    rustls_pemfile::private_key(&mut pem.as_slice())
        .map_err(|_| TlsError::Content { path: path.display().to_string(), what: "not valid PEM" })?
        .ok_or_else(|| TlsError::Content { path: path.display().to_string(), what: "no private key in the file" })
}

/// Something whose files are read again on SIGHUP or when they change.
pub trait Reloadable: Send + Sync + 'static {
    /// What the log calls it.
    fn name(&self) -> &'static str;
    fn files(&self) -> Vec<PathBuf>;
    fn reload(&self) -> Result<(), String>;
}

impl Reloadable for ServerTls {
    fn name(&self) -> &'static str {
        "TLS certificate"
    }

    fn files(&self) -> Vec<PathBuf> {
        let s = &self.settings;
        [Some(&s.cert_file), Some(&s.key_file), s.client_ca_file.as_ref()].into_iter().flatten().cloned().collect()
    }

    fn reload(&self) -> Result<(), String> {
        ServerTls::reload(self).map_err(|e| e.to_string())
    }
}

/// The files' modification times (`None` where one cannot be read).
pub(crate) fn modified(files: &[PathBuf]) -> Vec<Option<SystemTime>> {
    files.iter().map(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok()).collect()
}

/// Reloads `items` on SIGHUP, and each one whose files' modification times
/// changed, checked every `interval`, until `shutdown`.
pub async fn watch_files(items: Vec<Arc<dyn Reloadable>>, interval: Duration, mut shutdown: watch::Receiver<bool>) {
    if items.is_empty() {
        return;
    }
    let mut seen: Vec<Vec<Option<SystemTime>>> = items.iter().map(|i| modified(&i.files())).collect();
    let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP; reloading on file changes only");
            None
        }
    };
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        let forced = tokio::select! {
            _ = tick.tick() => false,
            Some(()) = async { match hangup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => true,
            _ = shutdown.changed() => return,
        };
        for (item, seen) in items.iter().zip(seen.iter_mut()) {
            let now = modified(&item.files());
            if !forced && now == *seen {
                continue;
            }
            match item.reload() {
                Ok(()) => {
                    *seen = now;
                    tracing::info!(what = item.name(), "reloaded");
                }
                // Kept, and tried again at the next tick: a rotation may be
                // half-way (the certificate written, the key not yet).
                Err(e) => tracing::warn!(what = item.name(), error = %e, "reload failed; keeping the previous one"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pki(dir: &Path, name: &str) -> TlsSettings {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap().self_signed(&key).unwrap();
        let (cert_file, key_file) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        TlsSettings {
            cert_file,
            key_file,
            client_ca_file: None,
            client_cert_required: false,
            reload_interval: Duration::from_secs(1),
        }
    }

    #[test]
    fn loads_and_offers_the_right_alpn() {
        let dir = tempfile::tempdir().unwrap();
        let tls = ServerTls::load(&pki(dir.path(), "fanout.test")).unwrap();
        assert_eq!(tls.grpc().alpn_protocols, vec![b"h2".to_vec()]);
        assert_eq!(tls.http().alpn_protocols, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
    }

    #[test]
    fn a_broken_file_is_refused_and_a_failed_reload_keeps_the_old_config() {
        let dir = tempfile::tempdir().unwrap();
        let settings = pki(dir.path(), "fanout.test");
        let tls = ServerTls::load(&settings).unwrap();
        let before = tls.grpc();
        std::fs::write(&settings.key_file, "not a key").unwrap();
        assert!(ServerTls::load(&settings).err().unwrap().to_string().contains("no private key"));
        assert!(Reloadable::reload(tls.as_ref()).is_err());
        assert!(Arc::ptr_eq(&before, &tls.grpc()), "the previous configuration stays");
        let missing = TlsSettings { cert_file: dir.path().join("absent.pem"), ..settings };
        assert!(ServerTls::load(&missing).err().unwrap().to_string().contains("cannot read"));
    }
}
