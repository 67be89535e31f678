//! Certificate expiry: the time left on every certificate this process holds,
//! as the gauge `fanout_certificate_expiry_seconds{certificate}`, computed
//! at each scrape and exported from start, so an alert can fire days before
//! a listener certificate, a CA the listeners or the forwards verify with,
//! the store's CA or a channel's extra CA runs out.
//!
//! Each source is the earliest `notAfter` among the certificates of its
//! files (a chain is only as good as its first member to expire). The
//! listener's files are read again when they change, as the listeners
//! reload them; every other file is read once, at start, as the component
//! that uses it does, so the gauge says what the process holds, not what is
//! on disk. Keys that do not expire (APNs `.p8`, VAPID, webhook and relay
//! secrets) and FCM service-account keys (whose expiry the file does not
//! carry) have no series.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{GaugeVec, Opts, Registry};
use rustls::pki_types::CertificateDer;

use crate::config::{Config, StoreBackend};
use crate::tls::{certificates, modified};

const NAME: &str = "fanout_certificate_expiry_seconds";
const HELP: &str =
    "Seconds until the earliest notAfter of a certificate source the process holds (negative once expired)";

/// One source: its label value, its files, and whether they are read again
/// when they change.
struct Source {
    certificate: String,
    files: Vec<PathBuf>,
    reloaded: bool,
    held: Mutex<Held>,
}

/// What the process holds of a source: the files' modification times when
/// read, and the earliest notAfter (Unix seconds).
struct Held {
    modified: Vec<Option<SystemTime>>,
    not_after: Option<i64>,
}

/// The collector registered with the engine's registry.
pub struct CertificateExpiry {
    sources: Vec<Source>,
    gauge: GaugeVec,
}

impl CertificateExpiry {
    /// Every dated source the configuration names, read now; registered
    /// with `registry`. A file that holds no readable certificate has no
    /// series (the component that uses it refuses it at start).
    pub fn register(config: &Config, registry: &Registry) -> prometheus::Result<()> {
        let mut sources = Vec::new();
        let mut add = |certificate: &str, files: Vec<PathBuf>, reloaded: bool| {
            if !files.is_empty() {
                sources.push(Source::read(certificate.to_owned(), files, reloaded));
            }
        };
        if let Some(tls) = &config.server.tls {
            add("listener", vec![tls.cert_file.clone()], true);
            add("client_ca", tls.client_ca_file.iter().cloned().collect(), true);
            if config.server.forwarding.enabled {
                add("forwarding_ca", config.server.forwarding.ca_file.iter().cloned().collect(), true);
            }
        }
        if matches!(config.store.backend, StoreBackend::Scylla)
            && let Some(tls) = &config.store.scylla.tls
        {
            add("store_ca", tls.ca_files.clone(), false);
        }
        for (channel, files) in config.engine.channels.extra_ca_files() {
            add(&format!("{}_ca", channel.as_str()), files.to_vec(), false);
        }
        let gauge = GaugeVec::new(Opts::new(NAME, HELP), &["certificate"])?;
        registry.register(Box::new(Self { sources, gauge }))
    }
}

impl Source {
    fn read(certificate: String, files: Vec<PathBuf>, reloaded: bool) -> Self {
        let held = Held { modified: modified(&files), not_after: earliest_not_after(&files) };
        Self { certificate, files, reloaded, held: Mutex::new(held) }
    }

    /// The earliest notAfter the process holds now: for a reloaded source,
    /// read again when its files changed and still hold certificates (a
    /// half-written file keeps the previous value, as the listener keeps its
    /// previous configuration).
    fn not_after(&self) -> Option<i64> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if self.reloaded {
            let now = modified(&self.files);
            if now != held.modified
                && let Some(not_after) = earliest_not_after(&self.files)
            {
                *held = Held { modified: now, not_after: Some(not_after) };
            }
        }
        held.not_after
    }
}

impl Collector for CertificateExpiry {
    fn desc(&self) -> Vec<&Desc> {
        self.gauge.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
        for source in &self.sources {
            if let Some(not_after) = source.not_after() {
                self.gauge.with_label_values(&[source.certificate.as_str()]).set((not_after - now) as f64);
            }
        }
        self.gauge.collect()
    }
}

/// The earliest notAfter of every certificate in `files`; `None` when any
/// file cannot be read or holds none.
fn earliest_not_after(files: &[PathBuf]) -> Option<i64> {
    files.iter().map(|f| file_not_after(f)).collect::<Option<Vec<i64>>>()?.into_iter().min()
}

fn file_not_after(path: &Path) -> Option<i64> {
    let not_after = |der: &CertificateDer<'_>| {
        x509_parser::parse_x509_certificate(der).ok().map(|(_, cert)| cert.validity().not_after.timestamp())
    };
    certificates(path).ok()?.iter().map(not_after).collect::<Option<Vec<i64>>>()?.into_iter().min()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate valid until `not_after` (Unix seconds).
    fn certificate(not_after: i64) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["fanout.test".to_owned()]).unwrap();
        params.not_after = time::OffsetDateTime::from_unix_timestamp(not_after).unwrap();
        params.self_signed(&key).unwrap().pem()
    }

    fn value(registry: &Registry, certificate: &str) -> Option<f64> {
        registry.gather().iter().find(|f| f.name() == NAME).and_then(|f| {
            f.get_metric()
                .iter()
                .find(|m| m.get_label().iter().any(|l| l.value() == certificate))
                .map(|m| m.get_gauge().get_value())
        })
    }

    fn now() -> i64 {
        SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs() as i64
    }

    #[test]
    fn every_dated_source_is_exported_with_its_earliest_not_after() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let in_days = |days: i64| now() + days * 86_400;
        // The listener's chain: its intermediate expires first.
        let chain = write("chain.pem", certificate(in_days(90)) + &certificate(in_days(30)));
        let key = write("key.pem", String::new());
        let client_ca = write("client-ca.pem", certificate(in_days(365)));
        let apns_ca = write("apns-ca.pem", certificate(in_days(-2)));
        let toml = format!(
            "[server.tls]\ncert_file = {chain:?}\nkey_file = {key:?}\nclient_ca_file = {client_ca:?}\n\
             [engine.channels.http]\n[engine.channels.apns]\nkey_file = \"/k.p8\"\nkey_id = \"KEY1234567\"\n\
             team_id = \"TEAM123456\"\nbundle_id = \"com.example\"\nenvironment = \"sandbox\"\nextra_ca_files = [{apns_ca:?}]\n"
        );
        let file = write("fanout.toml", toml);
        let config = Config::load(Some(&file)).unwrap();
        let registry = Registry::new();
        CertificateExpiry::register(&config, &registry).unwrap();

        let near = |got: Option<f64>, days: i64| {
            let got = got.expect("a series");
            assert!((got - (days * 86_400) as f64).abs() < 120.0, "{got} is not {days} days");
        };
        near(value(&registry, "listener"), 30);
        near(value(&registry, "client_ca"), 365);
        near(value(&registry, "apns_ca"), -2);
        assert_eq!(value(&registry, "http_ca"), None, "no extra CA: no series");
        assert_eq!(value(&registry, "store_ca"), None, "the embedded store has no CA");

        // A rotated listener certificate is read again; a half-written one
        // keeps what the process holds.
        std::fs::write(&chain, "-----BEGIN CERTIFICATE-----\ntrunc").unwrap();
        near(value(&registry, "listener"), 30);
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&chain, certificate(in_days(200))).unwrap();
        near(value(&registry, "listener"), 200);
        // A channel's CA is read once, as the channel reads it.
        std::fs::write(&apns_ca, certificate(in_days(400))).unwrap();
        near(value(&registry, "apns_ca"), -2);
    }
}
