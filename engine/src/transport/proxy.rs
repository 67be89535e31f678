//! The outbound proxy: an HTTP proxy the channels open their connections
//! through with CONNECT (RFC 9110 section 9.3.6), for deployments whose only
//! way out is a proxy.
//!
//! A tunnel carries the channel's own TLS, so the proxy sees host and port,
//! never a request. Where the destination guard applies (PUSH-256), the
//! engine resolves and checks the name itself and asks the proxy for the
//! checked address, never the name: a proxy resolving the name again could
//! be answered with an address inside the network (DNS rebinding). Provider
//! hosts are asked for by name, as any client behind a proxy does.
//!
//! The credentials (`credentials_file`, one `user:password` line) become a
//! `Proxy-Authorization: Basic` header; neither they nor the proxy's answer
//! body reach a log or an error message.

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::domain::Channel;

/// The longest answer head to a CONNECT read before giving up.
const MAX_ANSWER_HEAD: usize = 8 * 1024;

/// `[engine.outbound_proxy]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboundProxySettings {
    /// `http://host:port` of an HTTP proxy that supports CONNECT.
    pub url: ProxyUrl,
    /// A file holding `user:password` for the proxy's Basic authentication;
    /// absent: the proxy is asked without credentials.
    #[serde(default)]
    pub credentials_file: Option<PathBuf>,
    /// The channels that connect through the proxy (names of
    /// `[engine.channels.<name>]` tables); absent: every channel.
    #[serde(default)]
    pub channels: Option<ProxiedChannels>,
}

/// The proxy's address, from an `http://host:port` URL: the scheme is
/// `http` (the tunnel carries the channel's own TLS), the port is explicit,
/// and there are no credentials, path or query in it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct ProxyUrl {
    /// `host:port`, as `TcpStream::connect` takes it.
    address: String,
}

impl TryFrom<String> for ProxyUrl {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        let rest = text.strip_prefix("http://").ok_or("must start with http:// (the tunnel carries its own TLS)")?;
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains('@') {
            return Err("must not hold credentials: put them in credentials_file".into());
        }
        if authority.contains(['/', '?', '#']) {
            return Err("must be http://host:port, without a path or query".into());
        }
        let uri: http::uri::Authority = authority.parse().map_err(|_| "must be http://host:port".to_string())?;
        if uri.host().is_empty() {
            return Err("must name the proxy's host".into());
        }
        let Some(port) = uri.port_u16().filter(|p| *p != 0) else {
            return Err("must name the proxy's port, e.g. http://proxy.internal:3128".into());
        };
        Ok(Self { address: format!("{}:{port}", uri.host()) })
    }
}

/// `channels`: names of channels, each known to this build.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "Vec<String>")]
pub struct ProxiedChannels(Vec<Channel>);

impl TryFrom<Vec<String>> for ProxiedChannels {
    type Error = String;

    fn try_from(names: Vec<String>) -> Result<Self, String> {
        let channels = names
            .iter()
            .map(|name| Channel::parse(name).ok_or_else(|| format!("unknown channel `{name}`")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self(channels))
    }
}

/// The proxy as the connector uses it: its address, the header that
/// authenticates to it, and which channels it serves.
pub struct OutboundProxy {
    address: String,
    /// `Basic <base64(user:password)>`.
    authorization: Option<String>,
    channels: Option<Vec<Channel>>,
}

impl std::fmt::Debug for OutboundProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboundProxy")
            .field("authorization", &self.authorization.as_ref().map(|_| "<hidden>"))
            .field("channels", &self.channels)
            .finish_non_exhaustive()
    }
}

/// Why the proxy's settings cannot be used; the message never holds the
/// credentials.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct ProxySettingsError {
    pub key: &'static str,
    pub reason: String,
}

impl OutboundProxy {
    /// Reads the credentials file. Fails naming the key when it cannot be
    /// read or is not one `user:password` line.
    pub fn new(settings: &OutboundProxySettings) -> Result<Self, ProxySettingsError> {
        const KEY: &str = "engine.outbound_proxy.credentials_file";
        let authorization = match &settings.credentials_file {
            None => None,
            Some(path) => {
                let refuse = |reason: String| ProxySettingsError { key: KEY, reason };
                let text = std::fs::read_to_string(path)
                    .map_err(|e| refuse(format!("cannot read {}: {e}", path.display())))?;
                let line = text.trim_end_matches(['\r', '\n']);
                if line.contains(['\r', '\n']) || !line.contains(':') || line.starts_with(':') {
                    return Err(refuse(format!("{} must hold one line, user:password", path.display())));
                }
                Some(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(line)))
            }
        };
        Ok(Self {
            address: settings.url.address.clone(),
            authorization,
            channels: settings.channels.as_ref().map(|c| c.0.clone()),
        })
    }

    /// Whether `channel` connects through the proxy.
    pub fn serves(&self, channel: Channel) -> bool {
        self.channels.as_ref().is_none_or(|c| c.contains(&channel))
    }

    /// A TCP connection to the proxy, tunnelled to `authority` (`host:port`
    /// or `ip:port`). No bound of its own: the connector bounds it.
    pub async fn tunnel(&self, authority: &str) -> Result<TcpStream, ProxyError> {
        let mut stream = TcpStream::connect(&self.address).await.map_err(ProxyError::Unreachable)?;
        stream.set_nodelay(true).map_err(ProxyError::Io)?;
        let mut request = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n");
        if let Some(authorization) = &self.authorization {
            request.push_str("Proxy-Authorization: ");
            request.push_str(authorization);
            request.push_str("\r\n");
        }
        request.push_str("\r\n");
        stream.write_all(request.as_bytes()).await.map_err(ProxyError::Io)?;
        let head = read_answer_head(&mut stream).await?;
        match answer_status(&head.bytes)? {
            200..=299 if head.extra => {
                Err(ProxyError::Malformed("data followed the answer before the tunnel was used"))
            }
            200..=299 => Ok(stream),
            status => Err(ProxyError::Refused(status)),
        }
    }
}

/// Why a tunnel could not be opened. No message names the proxy, the
/// destination or the credentials.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("cannot connect to the outbound proxy: {0}")]
    Unreachable(std::io::Error),
    #[error("the connection to the outbound proxy failed: {0}")]
    Io(std::io::Error),
    #[error("the outbound proxy closed the connection before answering CONNECT")]
    Closed,
    #[error("the outbound proxy answered CONNECT with status {0}")]
    Refused(u16),
    #[error("the outbound proxy's answer to CONNECT is malformed: {0}")]
    Malformed(&'static str),
    #[error("no tunnel from the outbound proxy within {0:?}")]
    Timeout(Duration),
}

struct AnswerHead {
    bytes: Vec<u8>,
    /// Bytes came after the head's blank line.
    extra: bool,
}

/// Reads up to and including the blank line that ends the answer's head.
async fn read_answer_head(stream: &mut TcpStream) -> Result<AnswerHead, ProxyError> {
    let mut bytes = Vec::with_capacity(256);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await.map_err(ProxyError::Io)?;
        if n == 0 {
            return Err(ProxyError::Closed);
        }
        bytes.extend_from_slice(&chunk[..n]);
        if let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            let extra = end + 4 < bytes.len();
            bytes.truncate(end + 4);
            return Ok(AnswerHead { bytes, extra });
        }
        if bytes.len() > MAX_ANSWER_HEAD {
            return Err(ProxyError::Malformed("the answer's head is too long"));
        }
    }
}

/// The status of `HTTP/1.x NNN reason`.
fn answer_status(head: &[u8]) -> Result<u16, ProxyError> {
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let mut parts = line.splitn(3, |b| *b == b' ');
    let version = parts.next().unwrap_or_default();
    let status = parts.next().unwrap_or_default();
    if !version.starts_with(b"HTTP/1.") || status.len() != 3 || !status.iter().all(u8::is_ascii_digit) {
        return Err(ProxyError::Malformed("not an HTTP/1 status line"));
    }
    Ok(status.iter().fold(0u16, |n, d| n * 10 + u16::from(d - b'0')))
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use tokio::net::TcpListener;

    use super::*;

    fn settings(json: serde_json::Value) -> Result<OutboundProxySettings, String> {
        serde_json::from_value(json).map_err(|e| e.to_string())
    }

    #[test]
    fn the_url_is_http_with_a_host_and_a_port_and_nothing_else() {
        let ok = settings(serde_json::json!({"url": "http://proxy.internal:3128"})).unwrap();
        assert_eq!(ok.url.address, "proxy.internal:3128");
        let ok = settings(serde_json::json!({"url": "http://[::1]:8080/"})).unwrap();
        assert_eq!(ok.url.address, "[::1]:8080");
        let refused = |url: &str, rule: &str| {
            let err = settings(serde_json::json!({"url": url})).unwrap_err();
            assert!(err.contains(rule), "{url}: {err}");
        };
        refused("https://proxy:3128", "must start with http://");
        refused("proxy:3128", "must start with http://");
        refused("http://proxy", "must name the proxy's port");
        refused("http://proxy:0", "must name the proxy's port");
        refused("http://user:secret@proxy:3128", "must not hold credentials");
        refused("http://proxy:3128/path", "without a path");
        let err = settings(serde_json::json!({"url": "http://p:1", "channels": ["apns", "telegraph"]})).unwrap_err();
        assert!(err.contains("unknown channel `telegraph`"), "{err}");
        let err = settings(serde_json::json!({"url": "http://p:1", "user": "x"})).unwrap_err();
        assert!(err.contains("unknown field `user`"), "{err}");
    }

    #[test]
    fn the_example_block_parses() {
        let example: OutboundProxySettings = crate::testing::example_block("engine.outbound_proxy").try_into().unwrap();
        assert_eq!(example.url.address, "proxy.internal:3128");
        let every: Vec<String> = Channel::ALL.iter().map(|c| c.as_str().to_owned()).collect();
        let listed = example.channels.unwrap().0;
        assert!(
            every.iter().all(|c| c == "probe" || listed.iter().any(|l| l.as_str() == c)),
            "the example lists every channel"
        );
    }

    #[test]
    fn channels_absent_means_every_channel() {
        let every = OutboundProxy::new(&settings(serde_json::json!({"url": "http://p:1"})).unwrap()).unwrap();
        assert!(Channel::ALL.iter().all(|c| every.serves(*c)));
        let some = settings(serde_json::json!({"url": "http://p:1", "channels": ["apns", "http"]})).unwrap();
        let some = OutboundProxy::new(&some).unwrap();
        assert!(some.serves(Channel::Apns) && some.serves(Channel::Http));
        assert!(!some.serves(Channel::Fcm) && !some.serves(Channel::WebPush));
    }

    #[test]
    fn the_credentials_file_is_one_line_and_is_never_shown() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(file, "fanout:s3cret").unwrap();
        let s = settings(serde_json::json!({"url": "http://p:1", "credentials_file": file.path()})).unwrap();
        let proxy = OutboundProxy::new(&s).unwrap();
        assert_eq!(proxy.authorization.as_deref(), Some("Basic ZmFub3V0OnMzY3JldA=="));
        assert!(!format!("{proxy:?}").contains("ZmFub3V0"), "Debug hides the header");

        let mut two_lines = tempfile::NamedTempFile::new().unwrap();
        write!(two_lines, "a:b\nc:d\n").unwrap();
        let s = settings(serde_json::json!({"url": "http://p:1", "credentials_file": two_lines.path()})).unwrap();
        let err = OutboundProxy::new(&s).unwrap_err().to_string();
        assert!(err.starts_with("engine.outbound_proxy.credentials_file:") && err.contains("one line"), "{err}");
        assert!(!err.contains("a:b"), "the message never holds the credentials: {err}");
        let s = settings(serde_json::json!({"url": "http://p:1", "credentials_file": "/nonexistent/creds"})).unwrap();
        let err = OutboundProxy::new(&s).unwrap_err().to_string();
        assert!(err.contains("cannot read /nonexistent/creds"), "{err}");
    }

    /// A proxy on a socket that answers the first CONNECT with `answer`
    /// and hands back the request it read.
    async fn one_answer(answer: &'static [u8]) -> (OutboundProxy, tokio::task::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let mut file = tempfile::NamedTempFile::new().unwrap();
        write!(file, "u:p").unwrap();
        let s = settings(serde_json::json!({"url": url, "credentials_file": file.path()})).unwrap();
        let proxy = OutboundProxy::new(&s).unwrap();
        let served = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut chunk = [0u8; 512];
            while !request.ends_with(b"\r\n\r\n") {
                let n = socket.read(&mut chunk).await.unwrap();
                request.extend_from_slice(&chunk[..n]);
            }
            socket.write_all(answer).await.unwrap();
            String::from_utf8(request).unwrap()
        });
        (proxy, served)
    }

    #[tokio::test]
    async fn a_tunnel_is_a_connect_with_the_credentials() {
        let (proxy, served) = one_answer(b"HTTP/1.1 200 Connection established\r\n\r\n").await;
        proxy.tunnel("10.1.2.3:443").await.expect("tunnel");
        let request = served.await.unwrap();
        assert_eq!(
            request,
            "CONNECT 10.1.2.3:443 HTTP/1.1\r\nHost: 10.1.2.3:443\r\nProxy-Authorization: Basic dTpw\r\n\r\n"
        );
    }

    #[tokio::test]
    async fn a_refusal_is_its_status_and_a_garbled_answer_is_malformed() {
        let (proxy, _) = one_answer(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 3\r\n\r\nno!").await;
        assert!(matches!(proxy.tunnel("h:443").await, Err(ProxyError::Refused(503))));
        let (proxy, _) = one_answer(b"HTTP/1.0 407 Proxy Authentication Required\r\n\r\n").await;
        assert!(matches!(proxy.tunnel("h:443").await, Err(ProxyError::Refused(407))));
        let (proxy, _) = one_answer(b"SSH-2.0-OpenSSH\r\n\r\n").await;
        assert!(matches!(proxy.tunnel("h:443").await, Err(ProxyError::Malformed(_))));
        let (proxy, _) = one_answer(b"HTTP/1.1 200 OK\r\n\r\nearly").await;
        assert!(matches!(proxy.tunnel("h:443").await, Err(ProxyError::Malformed(_))));
    }

    #[tokio::test]
    async fn an_unreachable_proxy_says_so() {
        let port = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
        let s = settings(serde_json::json!({"url": format!("http://127.0.0.1:{port}")})).unwrap();
        let err = OutboundProxy::new(&s).unwrap().tunnel("h:443").await.unwrap_err();
        assert!(matches!(err, ProxyError::Unreachable(_)), "{err}");
    }
}
