//! Host name resolution for webhook destinations (PUSH-256: resolve at
//! registration and again before every attempt).
//!
//! `HostResolver` is the seam: production uses `HickoryResolver`, unit tests
//! use an in-memory map, end-to-end tests point `HickoryResolver` at a DNS
//! server on 127.0.0.1.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig, ResolverOpts,
};
use hickory_resolver::net::NetError;
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::Name;

/// Why a lookup found no address. Messages never name the host (PUSH-254).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// NXDOMAIN, or the name has no A or AAAA record.
    #[error("dns name has no address record")]
    NoRecords,
    #[error("dns lookup timed out")]
    Timeout,
    #[error("host is not a valid dns name")]
    InvalidName,
    #[error("dns lookup failed")]
    Failed,
    /// Building the resolver failed (e.g. an unreadable /etc/resolv.conf).
    #[error("dns resolver configuration is invalid: {0}")]
    Config(String),
}

/// Resolves a host name to every A and AAAA address it has now.
#[async_trait::async_trait]
pub trait HostResolver: Send + Sync + 'static {
    async fn resolve(&self, host: &str) -> Result<Vec<IpAddr>, ResolveError>;
}

/// Per-query timeout of one nameserver exchange.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);
/// Retries after a failed exchange.
const QUERY_ATTEMPTS: usize = 2;
/// Bound on one whole lookup, A and AAAA together, retries included.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// Responses kept in hickory's TTL-respecting cache.
const CACHE_SIZE: u64 = 256;

/// A DNS resolver over hickory-resolver on tokio: A + AAAA, names treated as
/// fully qualified (no search domains), bounded in time.
#[derive(Clone)]
pub struct HickoryResolver {
    inner: TokioResolver,
}

impl HickoryResolver {
    /// With `nameservers` non-empty, query exactly those (UDP, and TCP for
    /// truncated answers) and ignore /etc/hosts; with it empty, use the
    /// system configuration (/etc/resolv.conf).
    pub fn new(nameservers: &[SocketAddr]) -> Result<Self, ResolveError> {
        let mut builder = if nameservers.is_empty() {
            TokioResolver::builder_tokio().map_err(|e| ResolveError::Config(e.to_string()))?
        } else {
            let servers = nameservers
                .iter()
                .map(|addr| {
                    let mut udp = ConnectionConfig::udp();
                    udp.port = addr.port();
                    let mut tcp = ConnectionConfig::tcp();
                    tcp.port = addr.port();
                    NameServerConfig::new(addr.ip(), true, vec![udp, tcp])
                })
                .collect();
            let mut builder = TokioResolver::builder_with_config(
                ResolverConfig::from_name_servers(servers),
                TokioRuntimeProvider::default(),
            );
            builder.options_mut().use_hosts_file = ResolveHosts::Never;
            builder
        };
        let opts: &mut ResolverOpts = builder.options_mut();
        opts.timeout = QUERY_TIMEOUT;
        opts.attempts = QUERY_ATTEMPTS;
        // Both families, so every address the host has is checked.
        opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        opts.cache_size = CACHE_SIZE;
        opts.positive_max_ttl = Some(Duration::from_secs(300));
        opts.negative_max_ttl = Some(Duration::from_secs(30));
        let inner = builder.build().map_err(|e| ResolveError::Config(e.to_string()))?;
        Ok(Self { inner })
    }
}

crate::domain::redacted_debug!(HickoryResolver);

#[async_trait::async_trait]
impl HostResolver for HickoryResolver {
    async fn resolve(&self, host: &str) -> Result<Vec<IpAddr>, ResolveError> {
        let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(vec![ip]);
        }
        // A trailing dot makes the name fully qualified: no search domains.
        let fqdn = if host.ends_with('.') { host.to_owned() } else { format!("{host}.") };
        let name = Name::from_ascii(&fqdn).map_err(|_| ResolveError::InvalidName)?;
        let lookup = match tokio::time::timeout(LOOKUP_TIMEOUT, self.inner.lookup_ip(name)).await {
            Err(_) | Ok(Err(NetError::Timeout)) => return Err(ResolveError::Timeout),
            Ok(Err(e)) if e.is_no_records_found() => return Err(ResolveError::NoRecords),
            Ok(Err(_)) => return Err(ResolveError::Failed),
            Ok(Ok(lookup)) => lookup,
        };
        let mut addrs: Vec<IpAddr> = Vec::new();
        for ip in lookup.iter() {
            if !addrs.contains(&ip) {
                addrs.push(ip);
            }
        }
        if addrs.is_empty() {
            return Err(ResolveError::NoRecords);
        }
        Ok(addrs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Message, ResponseCode};
    use hickory_proto::rr::{RData, Record, RecordType};
    use tokio::net::UdpSocket;

    /// A minimal UDP DNS server: `public.test` has one A and one AAAA,
    /// `empty.test` has none, anything else is NXDOMAIN.
    async fn tiny_dns() -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            loop {
                let (len, peer) = socket.recv_from(&mut buf).await.unwrap();
                let request = Message::from_vec(&buf[..len]).unwrap();
                let query = request.queries[0].clone();
                let mut reply = Message::response(request.metadata.id, request.metadata.op_code);
                reply.metadata.recursion_desired = true;
                reply.metadata.recursion_available = true;
                reply.queries = request.queries.clone();
                let name = query.name().to_ascii().to_ascii_lowercase();
                let record: Option<IpAddr> = match (name.as_str(), query.query_type()) {
                    ("public.test.", RecordType::A) => Some("93.184.216.34".parse().unwrap()),
                    ("public.test.", RecordType::AAAA) => Some("2606:2800:220:1::1".parse().unwrap()),
                    _ => None,
                };
                if let Some(ip) = record {
                    reply.add_answer(Record::from_rdata(query.name().clone(), 0, RData::from(ip)));
                }
                if name != "public.test." && name != "empty.test." {
                    reply.metadata.response_code = ResponseCode::NXDomain;
                }
                socket.send_to(&reply.to_vec().unwrap(), peer).await.unwrap();
            }
        });
        (addr, task)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[tokio::test]
    async fn resolves_through_the_given_nameserver() {
        let (addr, task) = tiny_dns().await;
        let r = HickoryResolver::new(&[addr]).unwrap();
        let mut public = r.resolve("public.test").await.unwrap();
        public.sort();
        assert_eq!(public, vec![ip("93.184.216.34"), ip("2606:2800:220:1::1")]);
        let mut again = r.resolve("PUBLIC.test.").await.unwrap();
        again.sort();
        assert_eq!(again, public);
        assert_eq!(r.resolve("empty.test").await, Err(ResolveError::NoRecords));
        assert_eq!(r.resolve("nowhere.test").await, Err(ResolveError::NoRecords));
        assert_eq!(r.resolve("a..b").await, Err(ResolveError::InvalidName));
        // IP literals come back as themselves, without a query.
        assert_eq!(r.resolve("10.0.0.1").await, Ok(vec![ip("10.0.0.1")]));
        assert_eq!(r.resolve("[::1]").await, Ok(vec![ip("::1")]));
        task.abort();
    }

    #[tokio::test]
    async fn a_silent_nameserver_times_out() {
        // Bound but never answering.
        let silent = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let r = HickoryResolver::new(&[silent.local_addr().unwrap()]).unwrap();
        let started = std::time::Instant::now();
        let result = r.resolve("public.test").await;
        assert!(matches!(result, Err(ResolveError::Timeout | ResolveError::Failed)), "{result:?}");
        assert!(started.elapsed() <= LOOKUP_TIMEOUT + Duration::from_secs(1));
    }

    #[tokio::test]
    async fn system_configuration_builds() {
        if std::path::Path::new("/etc/resolv.conf").exists() {
            HickoryResolver::new(&[]).unwrap();
        }
    }

    /// DNS answers, property-tested against a server that says anything.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        use hickory_proto::rr::Name;
        use hickory_proto::rr::rdata::CNAME;
        use proptest::test_runner::{Config, TestRunner};

        /// One record of an answer: for the asked name or another, of
        /// either address type whatever was asked, or a CNAME.
        #[derive(Debug, Clone)]
        enum Answer {
            Address { asked_name: bool, ip: IpAddr },
            Alias { to_asked: bool },
        }

        fn answer() -> impl Strategy<Value = Answer> {
            prop_oneof![
                4 => (any::<bool>(), any::<IpAddr>()).prop_map(|(asked_name, ip)| Answer::Address { asked_name, ip }),
                1 => any::<bool>().prop_map(|to_asked| Answer::Alias { to_asked }),
            ]
        }

        fn code() -> impl Strategy<Value = ResponseCode> {
            prop_oneof![
                4 => Just(ResponseCode::NoError),
                1 => Just(ResponseCode::NXDomain),
                1 => Just(ResponseCode::ServFail),
                1 => Just(ResponseCode::Refused),
            ]
        }

        /// Answers every query with `code` and `records`, or with `garbage`
        /// (after the query's id and a response header) when it is set.
        async fn server(
            code: ResponseCode,
            records: Vec<Answer>,
            garbage: Option<Vec<u8>>,
        ) -> (SocketAddr, tokio::task::JoinHandle<()>) {
            let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            let addr = socket.local_addr().unwrap();
            let task = tokio::spawn(async move {
                let mut buf = [0u8; 2048];
                loop {
                    let Ok((len, peer)) = socket.recv_from(&mut buf).await else { return };
                    let request = Message::from_vec(&buf[..len]).unwrap();
                    let wire = match &garbage {
                        Some(bytes) => {
                            let mut wire = request.metadata.id.to_be_bytes().to_vec();
                            wire.extend_from_slice(&[0x81, 0x80]);
                            wire.extend_from_slice(bytes);
                            wire
                        }
                        None => {
                            let query = request.queries[0].clone();
                            let other = Name::from_ascii("other.test.").unwrap();
                            let mut reply = Message::response(request.metadata.id, request.metadata.op_code);
                            reply.metadata.recursion_available = true;
                            reply.metadata.response_code = code;
                            reply.queries = request.queries.clone();
                            for record in &records {
                                let rec = match record {
                                    Answer::Address { asked_name, ip } => {
                                        let name = if *asked_name { query.name().clone() } else { other.clone() };
                                        Record::from_rdata(name, 0, RData::from(*ip))
                                    }
                                    Answer::Alias { to_asked } => {
                                        let (from, to) = if *to_asked {
                                            (other.clone(), query.name().clone())
                                        } else {
                                            (query.name().clone(), other.clone())
                                        };
                                        Record::from_rdata(from, 0, RData::CNAME(CNAME(to)))
                                    }
                                };
                                reply.add_answer(rec);
                            }
                            reply.to_vec().unwrap()
                        }
                    };
                    let _ = socket.send_to(&wire, peer).await;
                }
            });
            (addr, task)
        }

        /// Whatever a nameserver answers, the lookup gives addresses it
        /// named, once each, or an error; never a panic or a hang past the
        /// lookup bound.
        #[test]
        fn any_answer_gives_named_addresses_or_an_error() {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let mut runner = TestRunner::new(Config { failure_persistence: None, ..Config::with_cases(48) });
            let case = (
                code(),
                prop::collection::vec(answer(), 0..8),
                proptest::option::weighted(0.1, prop::collection::vec(any::<u8>(), 0..60)),
            );
            runner
                .run(&case, |(code, records, garbage)| {
                    rt.block_on(async {
                        let (addr, task) = server(code, records.clone(), garbage.clone()).await;
                        let resolver = HickoryResolver::new(&[addr]).unwrap();
                        let started = tokio::time::Instant::now();
                        let result = resolver.resolve("asked.test").await;
                        task.abort();
                        prop_assert!(started.elapsed() <= LOOKUP_TIMEOUT + Duration::from_secs(1));
                        if let Ok(addrs) = result {
                            prop_assert!(!addrs.is_empty());
                            let named: Vec<IpAddr> = records
                                .iter()
                                .filter_map(|r| match r {
                                    Answer::Address { ip, .. } => Some(*ip),
                                    Answer::Alias { .. } => None,
                                })
                                .collect();
                            for (i, ip) in addrs.iter().enumerate() {
                                prop_assert!(named.contains(ip), "{ip} was never in an answer");
                                prop_assert!(!addrs[..i].contains(ip), "{ip} twice");
                            }
                        }
                        Ok(())
                    })
                })
                .unwrap();
        }
    }
}
