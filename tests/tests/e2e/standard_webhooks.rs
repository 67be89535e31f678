//! PUSH-235 checked by an independent verifier: the Standard Webhooks
//! reference library (Python, from PyPI) verifies real pushes, over HTTP/2 and
//! over HTTP/1.1 receivers, with the shortest and longest signing keys.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use base64::Engine as _;
use fanout_proto::v1 as pb;
use fanout_testkit::MockWebhookConfig;
use fanout_tests::EngineConfig;
use fanout_tests::client::{Recipient, envelope, group_topic, subscription};

use crate::common::*;

const LIBRARY: &str = "standardwebhooks==1.1.0";

/// A directory holding the library, installed from PyPI once per target dir.
fn library_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"), PathBuf::from);
    let dir = target.join("python-standardwebhooks");
    if !dir.join("standardwebhooks").exists() {
        let status = Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target"])
            .arg(&dir)
            .arg(LIBRARY)
            .status()
            .expect("run pip");
        assert!(status.success(), "pip install {LIBRARY} failed");
    }
    dir
}

async fn verify_with_reference_library(receiver: MockWebhookConfig, keys: &[Vec<u8>], version: &str) {
    let setup = webhook_setup_with(EngineConfig::default(), receiver).await;
    let topic = group_topic();
    for (i, key) in keys.iter().enumerate() {
        register_webhook(&setup, &Recipient::random(), &format!("/k{i}"), key, vec![subscription(&topic)]).await;
    }
    publish(&setup.fanout, (0..3).map(|_| envelope(&topic, pb::EnvelopeKind::Application, true)).collect()).await;
    let pushes = setup.receiver.wait_for(3 * keys.len(), DELIVERY_WAIT).await;
    assert_eq!(pushes.len(), 3 * keys.len());
    // The webhook channel negotiates the protocol by ALPN.
    assert!(pushes.iter().all(|p| p.version == version), "expected {version}");
    let b64 = base64::engine::general_purpose::STANDARD;
    let input: Vec<serde_json::Value> = pushes
        .iter()
        .map(|p| {
            let index: usize = p.path.trim_start_matches("/k").parse().unwrap();
            let headers: serde_json::Map<String, serde_json::Value> =
                p.headers.iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))).collect();
            serde_json::json!({
                "key_b64": b64.encode(&keys[index]),
                "headers": headers,
                "body": std::str::from_utf8(&p.body).unwrap(),
            })
        })
        .collect();
    let mut child = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/verify_standard_webhooks.py"))
        .env("PYTHONPATH", library_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python3");
    serde_json::to_writer(child.stdin.take().unwrap(), &input).unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "reference verifier refused: {report}");
    assert!(report.contains(&format!("verified {0} of {0}", pushes.len())), "{report}");
}

#[tokio::test]
async fn reference_library_verifies_pushes_over_http2() {
    verify_with_reference_library(MockWebhookConfig::default(), &[vec![0x11; 16], vec![0x22; 64]], "HTTP/2.0").await;
}

#[tokio::test]
async fn reference_library_verifies_pushes_over_http1() {
    verify_with_reference_library(MockWebhookConfig::http1_only(), &[vec![0x33; 32]], "HTTP/1.1").await;
}
