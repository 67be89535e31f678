//! The live progress line: on a terminal, one line on stderr rewritten with
//! `\r` every second; otherwise a plain line every ten seconds.

use std::io::{IsTerminal as _, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::collector::Collector;
use super::engine_process::proc_sample;

/// What the driver is doing, shared with the printer task.
#[derive(Default)]
pub struct Progress {
    phase: Mutex<String>,
    pub done: AtomicU64,
    pub total: AtomicU64,
    phase_started: Mutex<Option<Instant>>,
    collector: Mutex<Option<Arc<Collector>>>,
    pub engine_pid: AtomicU64,
}

impl Progress {
    pub fn new() -> Arc<Progress> {
        Arc::new(Progress::default())
    }

    /// Starts a phase counting `total` steps.
    pub fn phase(&self, name: &str, total: u64) {
        *self.phase.lock().unwrap_or_else(|p| p.into_inner()) = name.to_string();
        self.done.store(0, Ordering::Relaxed);
        self.total.store(total, Ordering::Relaxed);
        *self.phase_started.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }

    pub fn add(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
    }

    /// Also shows the collector's delivered/expected counts.
    pub fn watch(&self, collector: Arc<Collector>) {
        *self.collector.lock().unwrap_or_else(|p| p.into_inner()) = Some(collector);
    }

    fn line(&self, last_distinct: &mut u64, every: Duration) -> String {
        let phase = self.phase.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let (done, total) = (self.done.load(Ordering::Relaxed), self.total.load(Ordering::Relaxed));
        let elapsed =
            self.phase_started.lock().unwrap_or_else(|p| p.into_inner()).map_or(0.0, |s| s.elapsed().as_secs_f64());
        let rate = if elapsed > 0.0 { done as f64 / elapsed } else { 0.0 };
        let mut line = if total > 0 {
            format!("[{phase}] {done}/{total} ({rate:.0}/s, {elapsed:.0} s)")
        } else {
            format!("[{phase}] {elapsed:.0} s")
        };
        if let Some(c) = self.collector.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            let counts = c.counts();
            let now = (counts.distinct - (*last_distinct).min(counts.distinct)) as f64 / every.as_secs_f64();
            *last_distinct = counts.distinct;
            line.push_str(&format!(
                " delivered {}/{} ({now:.0}/s) requests {}",
                counts.distinct, counts.expected, counts.requests
            ));
        }
        let pid = self.engine_pid.load(Ordering::Relaxed);
        if pid != 0
            && let Some(s) = proc_sample(pid as u32)
        {
            line.push_str(&format!(" engine rss {} MiB cpu {:.0} s", s.rss_kib / 1024, s.cpu_seconds));
        }
        line
    }

    /// Prints until the returned handle is aborted.
    pub fn spawn_printer(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let tty = std::io::stderr().is_terminal();
            let every = if tty { Duration::from_secs(1) } else { Duration::from_secs(10) };
            let mut last = 0;
            let mut ticker = tokio::time::interval(every);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                let line = me.line(&mut last, every);
                let mut err = std::io::stderr().lock();
                if tty {
                    let _ = write!(err, "\r\x1b[2K{line}");
                } else {
                    let _ = writeln!(err, "{line}");
                }
                let _ = err.flush();
            }
        })
    }

    /// Prints a message on its own line (clearing the progress line first).
    pub fn say(&self, message: &str) {
        if std::io::stderr().is_terminal() {
            eprintln!("\r\x1b[2K{message}");
        } else {
            eprintln!("{message}");
        }
    }
}
