//! The connections to the other nodes: one lazily connected HTTP/2 channel
//! per advertised address, each with its bound on forwards in flight, and
//! the credentials every forward carries. Each node is reached as any
//! publisher reaches it: TLS when `[server.tls]` is set (its certificate
//! checked against `ca_file` or the system's roots), this node's own
//! certificate with `client_certificate`, and a bearer token from
//! `token_file` (or the publisher's own, passed on).
//!
//! The files are read again on SIGHUP and when they change, like the
//! server's (`tls::watch_files`); a reload drops the channels, so the next
//! forwards connect with the new files while those in flight finish on theirs.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::Semaphore;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::settings::ForwardSettings;
use crate::tls::{Reloadable, TlsSettings};

/// A TCP connect to another node that takes longer is a failure (the
/// forward's deadline bounds the whole call besides).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// HTTP/2 pings on a connection to another node, and how long an answer may
/// take: a frozen node's connection is closed rather than kept.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// Addresses kept at once: nodes come and go, each restart may advertise
/// another address, and the table must not grow for ever. Past it, the
/// table starts again empty (the next forwards reconnect).
const MAX_PEERS: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum PeersError {
    #[error("{key}: cannot read {path}: {source}")]
    Read { key: &'static str, path: String, source: std::io::Error },
    #[error("server.forwarding.token_file: {path} does not hold a token that fits an HTTP header")]
    Token { path: String },
}

/// What every forward carries, as the files last read say.
struct Credentials {
    tls: Option<ClientTlsConfig>,
    token: Option<AsciiMetadataValue>,
}

/// One other node: its channel and its slots for forwards in flight.
#[derive(Clone)]
pub struct Peer {
    pub channel: Channel,
    pub slots: Arc<Semaphore>,
}

pub struct Peers {
    settings: ForwardSettings,
    server_tls: Option<TlsSettings>,
    credentials: RwLock<Arc<Credentials>>,
    peers: Mutex<HashMap<String, Peer>>,
}

impl Peers {
    /// Reads the files once; an error here stops the start, naming the key.
    pub fn load(settings: &ForwardSettings, server_tls: Option<&TlsSettings>) -> Result<Self, PeersError> {
        let credentials = credentials(settings, server_tls)?;
        Ok(Self {
            settings: settings.clone(),
            server_tls: server_tls.cloned(),
            credentials: RwLock::new(Arc::new(credentials)),
            peers: Mutex::new(HashMap::new()),
        })
    }

    /// The node at `address`, connected lazily; `None` when the address is
    /// no URI authority.
    pub fn peer(&self, address: &str) -> Option<Peer> {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(peer) = peers.get(address) {
            return Some(peer.clone());
        }
        let credentials = self.credentials();
        let scheme = if credentials.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
            .ok()?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT);
        if let Some(tls) = &credentials.tls {
            endpoint = endpoint.tls_config(tls.clone()).ok()?;
        }
        let peer = Peer {
            channel: endpoint.connect_lazy(),
            slots: Arc::new(Semaphore::new(self.settings.max_in_flight_per_node.get())),
        };
        if peers.len() >= MAX_PEERS {
            peers.clear();
        }
        peers.insert(address.to_owned(), peer.clone());
        Some(peer)
    }

    /// The bearer token of `token_file`, if set.
    pub fn token(&self) -> Option<AsciiMetadataValue> {
        self.credentials().token.clone()
    }

    fn credentials(&self) -> Arc<Credentials> {
        self.credentials.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Reloadable for Peers {
    fn name(&self) -> &'static str {
        "forwarding credentials"
    }

    fn files(&self) -> Vec<std::path::PathBuf> {
        let s = &self.settings;
        let own = self.server_tls.as_ref().filter(|_| s.client_certificate);
        [s.token_file.as_ref(), s.ca_file.as_ref(), own.map(|t| &t.cert_file), own.map(|t| &t.key_file)]
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    }

    fn reload(&self) -> Result<(), String> {
        let credentials = credentials(&self.settings, self.server_tls.as_ref()).map_err(|e| e.to_string())?;
        *self.credentials.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(credentials);
        self.peers.lock().unwrap_or_else(|e| e.into_inner()).clear();
        Ok(())
    }
}

fn credentials(settings: &ForwardSettings, server_tls: Option<&TlsSettings>) -> Result<Credentials, PeersError> {
    let token = match &settings.token_file {
        None => None,
        Some(path) => {
            let text = read("server.forwarding.token_file", path)?;
            let token = String::from_utf8(text).ok().map(|t| t.trim().to_owned()).filter(|t| !t.is_empty());
            let value = token.and_then(|t| AsciiMetadataValue::try_from(format!("Bearer {t}")).ok());
            Some(value.ok_or_else(|| PeersError::Token { path: path.display().to_string() })?)
        }
    };
    let tls = match server_tls {
        None => None,
        Some(server) => {
            let mut tls = ClientTlsConfig::new();
            tls = match &settings.ca_file {
                Some(ca) => tls.ca_certificate(Certificate::from_pem(read("server.forwarding.ca_file", ca)?)),
                None => tls.with_native_roots(),
            };
            if let Some(name) = &settings.server_name {
                tls = tls.domain_name(name.clone());
            }
            if settings.client_certificate {
                let cert = read("server.tls.cert_file", &server.cert_file)?;
                let key = read("server.tls.key_file", &server.key_file)?;
                tls = tls.identity(Identity::from_pem(cert, key));
            }
            Some(tls)
        }
    };
    Ok(Credentials { tls, token })
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, PeersError> {
    std::fs::read(path).map_err(|source| PeersError::Read { key, path: path.display().to_string(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    // A lazily connected channel spawns its connection task on the runtime.
    #[tokio::test]
    async fn one_channel_per_address_and_a_reload_reads_the_token_again() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "first-token\n").unwrap();
        let settings = ForwardSettings { token_file: Some(token.clone()), ..ForwardSettings::default() };
        let peers = Peers::load(&settings, None).unwrap();
        assert_eq!(peers.token().unwrap().to_str().unwrap(), "Bearer first-token");
        let a = peers.peer("127.0.0.1:7001").unwrap();
        assert!(Arc::ptr_eq(&a.slots, &peers.peer("127.0.0.1:7001").unwrap().slots), "kept");
        assert_eq!(a.slots.available_permits(), 64);
        assert!(peers.peer("not an address").is_none());
        assert_eq!(peers.files(), [token.clone()]);

        std::fs::write(&token, "second-token").unwrap();
        peers.reload().unwrap();
        assert_eq!(peers.token().unwrap().to_str().unwrap(), "Bearer second-token");
        assert!(!Arc::ptr_eq(&a.slots, &peers.peer("127.0.0.1:7001").unwrap().slots), "reconnects after a reload");
        std::fs::write(&token, "").unwrap();
        assert!(peers.reload().unwrap_err().contains("server.forwarding.token_file"));
        assert_eq!(peers.token().unwrap().to_str().unwrap(), "Bearer second-token", "a bad file changes nothing");
        std::fs::remove_file(&token).unwrap();
        assert!(Peers::load(&settings, None).err().unwrap().to_string().contains("cannot read"));
    }
}
