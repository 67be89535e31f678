//! `--profile PATH`: where the engine's CPU time goes during the measured
//! interval. Linux `perf` samples the engine process (`perf record -g` at
//! 999 Hz) from the first request of the load to the end of the drain; `PATH.perf.data` keeps the samples for
//! `perf report -i` and flame graphs, `PATH.txt` is `perf report`'s flat
//! profile (self time by binary and symbol), and the report carries its top
//! lines.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::Serialize;

/// Sampling frequency: an odd rate, so samples do not beat with periodic work.
const FREQUENCY_HZ: &str = "999";
/// Symbols in the report's summary.
const TOP: usize = 25;
/// `perf report` leaves out lines below this share of the samples.
const PERCENT_LIMIT: &str = "0.3";

/// A `perf record` attached to the engine.
pub struct Profiler {
    child: Child,
    data: PathBuf,
    text: PathBuf,
}

/// What the report says of a profile.
#[derive(Debug, Clone, Serialize)]
pub struct ProfileSummary {
    /// The samples (`perf report -i` reads them).
    pub data: PathBuf,
    /// `perf report --stdio`'s flat profile.
    pub text: PathBuf,
    /// The top symbols by self time: (percent of samples, binary, symbol).
    pub top: Vec<(f64, String, String)>,
}

impl Profiler {
    /// `--profile`: sampling the engine `pid` from now when `path` is set.
    pub fn attach(path: Option<&Path>, pid: Option<u32>) -> anyhow::Result<Option<Self>> {
        match (path, pid) {
            (Some(path), Some(pid)) => Ok(Some(Self::start(pid, path)?)),
            (Some(_), None) => bail!("--profile: the engine is not a process the harness started"),
            (None, _) => Ok(None),
        }
    }

    /// Starts sampling process `pid` into `path.perf.data`.
    pub fn start(pid: u32, path: &Path) -> anyhow::Result<Self> {
        let data = with_suffix(path, "perf.data");
        let text = with_suffix(path, "txt");
        let child = Command::new("perf")
            .args(["record", "-g", "-F", FREQUENCY_HZ, "-p", &pid.to_string(), "-o"])
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("--profile runs `perf record` (Debian package linux-perf)")?;
        // perf attaches before it says anything; give it a moment to do so.
        std::thread::sleep(Duration::from_millis(200));
        Ok(Self { child, data, text })
    }

    /// Stops sampling (SIGINT, as perf expects) and writes the flat profile.
    pub fn finish(mut self) -> anyhow::Result<ProfileSummary> {
        Command::new("kill").args(["-INT", &self.child.id().to_string()]).status()?;
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                bail!("perf record did not stop within 60 s of SIGINT");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if !status.success() && !self.data.exists() {
            bail!("perf record failed ({status}); is perf_event_paranoid low enough?");
        }
        let report = Command::new("perf")
            .args(["report", "--stdio", "--no-children", "-g", "none", "--sort", "dso,sym", "--percent-limit"])
            .arg(PERCENT_LIMIT)
            .arg("-i")
            .arg(&self.data)
            .stderr(Stdio::null())
            .output()
            .context("perf report")?;
        std::fs::write(&self.text, &report.stdout).with_context(|| format!("{}", self.text.display()))?;
        let top = top_symbols(&String::from_utf8_lossy(&report.stdout), TOP);
        Ok(ProfileSummary { data: self.data.clone(), text: self.text.clone(), top })
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".");
    name.push(suffix);
    PathBuf::from(name)
}

/// The first `n` lines of a flat `perf report` (`  12.34%  dso  [.] symbol`).
fn top_symbols(report: &str, n: usize) -> Vec<(f64, String, String)> {
    report
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            let percent = parts.next()?.strip_suffix('%')?.parse().ok()?;
            let dso = parts.next()?.to_owned();
            let symbol = parts.skip(1).collect::<Vec<_>>().join(" ");
            Some((percent, dso, symbol))
        })
        .take(n)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flat_report_is_read_line_by_line() {
        let report = "# Samples: 10K of event 'cycles:P'\n#\n# Overhead  Shared Object  Symbol\n\
                      # ........\n#\n    12.50%  fanout         [.] _rjem_malloc\n     \
                      3.25%  [kernel.kallsyms]  [k] copy_user_generic_string\n\n     0.40%  libc.so.6  [.] memmove\n";
        assert_eq!(
            top_symbols(report, 2),
            vec![
                (12.5, "fanout".into(), "_rjem_malloc".into()),
                (3.25, "[kernel.kallsyms]".into(), "copy_user_generic_string".into())
            ]
        );
        assert_eq!(with_suffix(Path::new("/tmp/run"), "txt"), PathBuf::from("/tmp/run.txt"));
    }
}
