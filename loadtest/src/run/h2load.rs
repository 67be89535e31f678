//! The independent ceiling: nghttp2's `h2load` sends the run's
//! request (the same body, headers and signature as the engine's first
//! delivery) to the same mock receivers. The bare-client ceiling
//! (`ceiling.rs`) uses the engine's own client stack, so a ratio against it
//! only says the engine is as fast as its own HTTP client; h2load is another
//! implementation (C, nghttp2) and tells how far that client stack is from
//! what this machine can push through the same receiver.
//!
//! One `h2load` process per receiver (h2load takes one authority per run),
//! all at once; each opens `connections` HTTP/2 connections with `streams`
//! concurrent streams each. The rate is the requests that succeeded over the
//! wall time of the slowest process.

use std::process::Stdio;
use std::time::Instant;

use anyhow::{Context as _, bail};
use serde::Serialize;

use super::engine_process::{children_cpu_seconds, own_cpu_seconds};

/// The Debian package that ships `h2load`.
pub const PACKAGE: &str = "nghttp2-client";

#[derive(Debug, Clone, Default, Serialize)]
pub struct H2loadResult {
    pub requests: u64,
    /// HTTP/2 connections per receiver.
    pub connections: usize,
    /// Concurrent streams per connection.
    pub streams: usize,
    /// Requests answered 2xx.
    pub ok: u64,
    pub failed: u64,
    pub seconds: f64,
    pub requests_per_second: f64,
    /// The h2load processes' CPU (user + system) over the run, from the
    /// harness's waited-for children, so that a request's cost can be
    /// compared with the engine's and Pushy's; `None` without /proc.
    pub cpu_seconds: Option<f64>,
    /// The harness's own CPU over the run: the work of its mock receivers
    /// (unless the APNs peer is Pushy's server, another process).
    pub harness_cpu_seconds: Option<f64>,
    /// `h2load --version`'s first line.
    pub version: String,
}

/// Whether `h2load` can be run here.
pub fn available() -> bool {
    std::process::Command::new("h2load").arg("--version").output().is_ok_and(|o| o.status.success())
}

/// Sends `requests` copies of `request` (split over `urls`' receivers) with
/// h2load. The receivers must accept the same signed request many times.
pub async fn run(
    request: http::Request<bytes::Bytes>,
    urls: &[String],
    requests: u64,
    connections: usize,
    streams: usize,
) -> anyhow::Result<H2loadResult> {
    if !available() {
        bail!("h2load is not installed (Debian package {PACKAGE})");
    }
    let version = std::process::Command::new("h2load").arg("--version").output()?;
    let version = String::from_utf8_lossy(&version.stdout).lines().next().unwrap_or_default().to_owned();
    let (parts, body) = request.into_parts();
    let dir = tempfile::tempdir()?;
    let body_file = dir.path().join("body");
    std::fs::write(&body_file, &body)?;
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let mut headers = Vec::new();
    for (name, value) in &parts.headers {
        headers.push("-H".to_owned());
        headers.push(format!("{name}: {}", value.to_str().context("a header h2load can carry")?));
    }
    let per_receiver = requests.div_ceil(urls.len().max(1) as u64);
    // Only h2load's processes end while it runs: the engine and any Pushy
    // server are children that are still running.
    let cpu_before = children_cpu_seconds();
    let harness_cpu_before = own_cpu_seconds();
    let started = Instant::now();
    let mut processes = Vec::new();
    for url in urls {
        let base: http::Uri = url.parse().context("a receiver URL")?;
        let target =
            format!("{}://{}{path}", base.scheme_str().unwrap_or("https"), base.authority().context("authority")?);
        let child = tokio::process::Command::new("h2load")
            .args(["-n", &per_receiver.to_string(), "-c", &connections.to_string(), "-m", &streams.to_string()])
            .arg("-d")
            .arg(&body_file)
            .args(&headers)
            .arg(target)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting h2load")?;
        processes.push(child.wait_with_output());
    }
    let mut ok = 0;
    let mut total = 0;
    for output in futures::future::join_all(processes).await {
        let output = output?;
        let text = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            bail!("h2load failed: {}{}", text, String::from_utf8_lossy(&output.stderr));
        }
        let counts = parse(&text).with_context(|| format!("reading h2load's report:\n{text}"))?;
        ok += counts.succeeded_2xx;
        total += counts.done;
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = cpu_before.zip(children_cpu_seconds()).map(|(before, after)| after - before);
    let harness_cpu_seconds = harness_cpu_before.zip(own_cpu_seconds()).map(|(before, after)| after - before);
    Ok(H2loadResult {
        requests: total,
        connections,
        streams,
        ok,
        failed: total - ok,
        seconds,
        requests_per_second: ok as f64 / seconds.max(1e-9),
        cpu_seconds,
        harness_cpu_seconds,
        version,
    })
}

/// What one h2load report says.
#[derive(Debug, PartialEq, Eq)]
struct Counts {
    done: u64,
    succeeded_2xx: u64,
}

/// Reads `requests: N total, N started, N done, ...` and `status codes: N 2xx, ...`.
fn parse(report: &str) -> anyhow::Result<Counts> {
    let field = |line_start: &str, suffix: &str| -> anyhow::Result<u64> {
        let line = report.lines().find(|l| l.starts_with(line_start)).with_context(|| format!("no {line_start:?}"))?;
        line[line_start.len()..]
            .split(',')
            .map(str::trim)
            .find_map(|part| part.strip_suffix(suffix))
            .with_context(|| format!("no {suffix:?} in {line:?}"))?
            .trim()
            .parse()
            .context("a count")
    };
    Ok(Counts { done: field("requests:", " done")?, succeeded_2xx: field("status codes:", " 2xx")? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_h2loads_report() {
        // h2load 1.52.0's report (Debian 12), trimmed.
        let report = "\
finished in 1.01s, 9877.43 req/s, 2.25MB/s
requests: 10000 total, 10000 started, 9990 done, 9980 succeeded, 20 failed, 10 errored, 0 timeout
status codes: 9980 2xx, 0 3xx, 10 4xx, 0 5xx
traffic: 2.22MB (2329600) total, 97.70KB (100047) headers (space savings 95.64%), 458.98KB (470000) data
";
        assert_eq!(parse(report).unwrap(), Counts { done: 9990, succeeded_2xx: 9980 });
        assert!(parse("finished in 1s").is_err());
    }
}
