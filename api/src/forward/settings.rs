//! `[server.forwarding]`: how a node sends the envelopes of another node's
//! shards on to their owner.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use fanout_engine::duration;
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ForwardSettings {
    /// Forward an envelope of a shard another node owns to that node (the
    /// default). Off: answer it 14 UNAVAILABLE naming the owner, as a
    /// publisher that routes by itself needs no forward.
    pub enabled: bool,
    /// Forwarded requests in flight to one node at once; more wait for a
    /// slot within their deadline, then are answered UNAVAILABLE.
    pub max_in_flight_per_node: NonZeroUsize,
    /// The longest a forward may take, waiting for a slot included. A
    /// Publish's own shorter deadline wins (less a tenth, to answer in);
    /// a PublishStream batch has none, so this bounds its forwards.
    #[serde(rename = "timeout_ms", deserialize_with = "duration::millis")]
    pub timeout: Duration,
    /// A file holding the bearer token (not its hash) this node presents
    /// to the others, one the publisher role's token file lists. Absent:
    /// the publisher's own `authorization` header is passed on.
    pub token_file: Option<PathBuf>,
    /// With `[server.tls]`: PEM CAs that sign the other nodes' certificates.
    /// Absent: the system's roots.
    pub ca_file: Option<PathBuf>,
    /// With `[server.tls]`: the name the other nodes' certificates are
    /// checked for (one name shared by every node's certificate). Absent:
    /// the host of the address each node advertises.
    pub server_name: Option<String>,
    /// With `[server.tls]`: present this node's own certificate
    /// (`server.tls.cert_file`, `key_file`) to the others, for clusters
    /// whose nodes grant the publisher role by certificate identity.
    pub client_certificate: bool,
}

impl Default for ForwardSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            max_in_flight_per_node: NonZeroUsize::new(64).unwrap(),
            timeout: Duration::from_secs(10),
            token_file: None,
            ca_file: None,
            server_name: None,
            client_certificate: false,
        }
    }
}

impl ForwardSettings {
    /// The keys that mean something only with `[server.tls]`, when set
    /// without it: forwards are plaintext then.
    pub fn needs_tls(&self) -> Option<&'static str> {
        if self.ca_file.is_some() {
            Some("server.forwarding.ca_file")
        } else if self.server_name.is_some() {
            Some("server.forwarding.server_name")
        } else if self.client_certificate {
            Some("server.forwarding.client_certificate")
        } else {
            None
        }
    }
}
