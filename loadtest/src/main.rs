//! `fanout-loadtest`: load harness and standalone mock providers.
//!
//! `mock webhook|apns|fcm|all` run mock providers; `run` and `ceiling`
//! drive scenarios, `gateway` and `relay-ingress` the spec 002 and 003
//! front ends.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use fanout_testkit::{
    ApnsTestKey, MockApnsConfig, MockFcmConfig, MockWebhookConfig, Outage, OutageKind, TestPki, start_mock_apns,
    start_mock_fcm, start_mock_webhook,
};

#[derive(Parser)]
#[command(name = "fanout-loadtest", about = "Load harness and mock providers for fanout")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a mock provider until Ctrl-C.
    Mock {
        #[command(subcommand)]
        target: MockTarget,
    },
    /// Run a scenario against the real engine and report throughput, latency,
    /// missing deliveries, memory and CPU (see docs/BENCHMARKS.md).
    Run(fanout_loadtest::run::RunArgs),
    /// Measure the ceiling: the scenario's webhook requests sent straight to
    /// the mock receiver by a bare HTTP/2 client, no engine in between.
    Ceiling(fanout_loadtest::run::CeilingArgs),
    /// Spec 002's push gateway: signed notify requests in, FCM wake-ups out,
    /// with --with-ceiling the same FCM requests sent by the engine's FCM
    /// channel alone, and the ratio (see docs/BENCHMARKS.md).
    Gateway(fanout_loadtest::gateway::GatewayArgs),
    /// Spec 003's push-server side: signed relay webhooks in, APNs and FCM
    /// requests out, replayed delivery ids answered without a second
    /// provider request; with --with-ceiling the same pushes sent by the
    /// engine's APNs and FCM channels alone, and the ratio (see
    /// docs/BENCHMARKS.md). Exits non-zero when the run failed.
    RelayIngress(fanout_loadtest::relay_ingress::RelayIngressArgs),
}

#[derive(Subcommand)]
enum MockTarget {
    /// HTTPS webhook receiver (HTTP/1.1 and HTTP/2) that records and answers requests.
    Webhook(WebhookArgs),
    /// APNs (HTTP/2 only): verifies the ES256 provider token, answers 200 by default.
    Apns(ApnsArgs),
    /// FCM HTTP v1 with its OAuth2 token endpoint at /token; answers 200 by default.
    Fcm(FcmArgs),
    /// All three on their default ports (webhook 8443, APNs 8444, FCM 8445),
    /// with their CA, key and service-account files in --dir.
    All(AllArgs),
}

#[derive(Args)]
struct AllArgs {
    /// Directory for the CA certificates, the APNs key and the FCM service account.
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Delay before every answer, in milliseconds.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
}

#[derive(Args)]
struct ApnsArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8444")]
    bind: SocketAddr,
    /// Where to write the CA certificate (PEM) the engine must trust.
    #[arg(long, default_value = "./mock-apns-ca.pem")]
    ca_out: PathBuf,
    /// Where to write the generated provider key (.p8, PEM PKCS#8 EC P-256).
    #[arg(long, default_value = "./mock-apns-key.p8")]
    key_out: PathBuf,
    /// The key id the mock expects (JWT kid).
    #[arg(long, default_value = "KEY1234567")]
    key_id: String,
    /// The team id the mock expects (JWT iss).
    #[arg(long, default_value = "TEAM123456")]
    team_id: String,
    /// Delay before every answer, in milliseconds.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Extra DNS names for the server certificate (repeatable).
    #[arg(long = "dns-name")]
    dns_names: Vec<String>,
    #[command(flatten)]
    outage: OutageArgs,
}

#[derive(Args)]
struct FcmArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8445")]
    bind: SocketAddr,
    /// Where to write the CA certificate (PEM) the engine must trust.
    #[arg(long, default_value = "./mock-fcm-ca.pem")]
    ca_out: PathBuf,
    /// Where to write the TEST-ONLY service-account file (token_uri = the mock).
    #[arg(long, default_value = "./mock-fcm-service-account.json")]
    service_account_out: PathBuf,
    /// The project id of the service account.
    #[arg(long, default_value = "fanout-test-project")]
    project_id: String,
    /// Delay before every messages:send answer, in milliseconds.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Extra DNS names for the server certificate (repeatable).
    #[arg(long = "dns-name")]
    dns_names: Vec<String>,
    #[command(flatten)]
    outage: OutageArgs,
}

#[derive(Args)]
struct WebhookArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8443")]
    bind: SocketAddr,
    /// Where to write the CA certificate (PEM) the engine must trust.
    #[arg(long, default_value = "./mock-ca.pem")]
    ca_out: PathBuf,
    /// Offer only HTTP/1.1 in ALPN.
    #[arg(long)]
    http1_only: bool,
    /// Delay before every answer, in milliseconds.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Status to answer every request with.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u16).range(100..=999))]
    status: u16,
    /// Extra DNS names for the server certificate (repeatable).
    #[arg(long = "dns-name")]
    dns_names: Vec<String>,
    #[command(flatten)]
    outage: OutageArgs,
}

/// A provider outage on a timer: healthy, then failing, then healthy again.
#[derive(Args, Clone, Debug, Default)]
struct OutageArgs {
    /// Fail as a provider in an outage does: `hang` (connections and TLS
    /// work, requests are never answered), `refuse` (nothing listens:
    /// connections refused, open ones closed), `tls-stall` (TCP connects, the
    /// TLS handshake never completes), `slow` (every answer --outage-slow-ms
    /// late), `503` (every request answered 503).
    #[arg(long, value_parser = parse_outage)]
    outage: Option<OutageKind>,
    /// With --outage: seconds of normal service before the outage starts.
    #[arg(long, default_value_t = 0.0, requires = "outage")]
    outage_after_seconds: f64,
    /// With --outage: how long it lasts, in seconds, before the mock is
    /// healthy again on the same address (default: until Ctrl-C).
    #[arg(long, requires = "outage")]
    outage_seconds: Option<f64>,
    /// With --outage slow: the delay before every answer, in milliseconds.
    #[arg(long, default_value_t = 3000, requires = "outage")]
    outage_slow_ms: u64,
}

fn parse_outage(text: &str) -> Result<OutageKind, String> {
    text.parse()
}

impl OutageArgs {
    /// Starts the outage's timer on `switch` and says what it will do.
    fn apply(&self, switch: &Outage) -> anyhow::Result<()> {
        let Some(kind) = self.outage else { return Ok(()) };
        let kind = match kind {
            OutageKind::Slow(_) => OutageKind::Slow(Duration::from_millis(self.outage_slow_ms)),
            other => other,
        };
        let seconds = |s: f64, what: &str| {
            Duration::try_from_secs_f64(s).with_context(|| format!("{what} must be a number of seconds, 0 or more"))
        };
        let after = seconds(self.outage_after_seconds, "--outage-after-seconds")?;
        match self.outage_seconds {
            Some(lasts) => {
                let lasts = seconds(lasts, "--outage-seconds")?;
                println!("outage: {kind} from {after:?} after start, for {lasts:?}");
                switch.schedule(kind, after, lasts);
            }
            None => {
                println!("outage: {kind} from {after:?} after start, until Ctrl-C");
                let switch = switch.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    switch.start(kind);
                });
            }
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Mock { target: MockTarget::Webhook(args) } => mock_webhook(args).await,
        Command::Mock { target: MockTarget::Apns(args) } => mock_apns(args).await,
        Command::Mock { target: MockTarget::Fcm(args) } => mock_fcm(args).await,
        Command::Mock { target: MockTarget::All(args) } => mock_all(args).await,
        Command::Run(args) => fanout_loadtest::run::run_command(args).await,
        Command::Ceiling(args) => fanout_loadtest::run::ceiling_command(args).await,
        Command::Gateway(args) => {
            let report = fanout_loadtest::gateway::run(args).await?;
            println!("{}", serde_json::to_string_pretty(&report)?);
            if !report.errors.is_empty() {
                anyhow::bail!("gateway run failed: notify answers other than 200: {:?}", report.errors);
            }
            Ok(())
        }
        Command::RelayIngress(args) => {
            let report = fanout_loadtest::relay_ingress::run(args).await?;
            println!("{}", serde_json::to_string_pretty(&report)?);
            if !report.passed {
                anyhow::bail!("relay-ingress run failed: {}", report.failures.join("; "));
            }
            Ok(())
        }
    }
}

/// What an outage met, when there was one.
fn print_outage_count(outage: &Outage) {
    if outage.met() > 0 {
        println!("the outage held, slowed or refused {} requests or handshakes", outage.met());
    }
}

/// Prints the request count every 5 s until Ctrl-C.
async fn report_until_ctrl_c(count: impl Fn() -> usize) -> anyhow::Result<()> {
    let mut ticker = tokio::time::interval(Duration::from_secs(5));
    ticker.tick().await; // the first tick fires at once
    loop {
        tokio::select! {
            _ = ticker.tick() => println!("received {} requests", count()),
            result = tokio::signal::ctrl_c() => {
                result.context("waiting for Ctrl-C")?;
                break;
            }
        }
    }
    println!("stopping; received {} requests in total", count());
    Ok(())
}

async fn mock_apns(args: ApnsArgs) -> anyhow::Result<()> {
    let dns_names: Vec<&str> = args.dns_names.iter().map(String::as_str).collect();
    let pki = TestPki::generate(&dns_names).context("generating test PKI")?;
    pki.write_ca(&args.ca_out)?;
    let key = ApnsTestKey::generate()?;
    key.write_p8(&args.key_out)?;
    let config = MockApnsConfig {
        bind: args.bind,
        latency: Duration::from_millis(args.latency_ms),
        team_id: args.team_id.clone(),
        key_id: args.key_id.clone(),
        public_key_pem: Some(key.public_pem.clone()),
        ..MockApnsConfig::default()
    };
    let mock = start_mock_apns(&pki, config).await?;
    println!("mock APNs listening on {}", mock.base_url());
    args.outage.apply(mock.outage())?;
    println!("engine configuration:\n");
    println!("[engine.channels.apns]");
    println!("key_file = {:?}", args.key_out.display().to_string());
    println!("key_id = {:?}\nteam_id = {:?}", args.key_id, args.team_id);
    println!("bundle_id = \"com.example.app\"\nenvironment = \"sandbox\"");
    println!("sandbox_url = {:?}", mock.base_url());
    println!("extra_ca_files = [{:?}]\n", args.ca_out.display().to_string());
    report_until_ctrl_c(|| mock.received_count()).await?;
    print_outage_count(mock.outage());
    let wire = fanout_loadtest::run::report::WireReport::from(mock.wire());
    println!("on the wire: {}", wire.line());
    mock.shutdown().await;
    Ok(())
}

async fn mock_fcm(args: FcmArgs) -> anyhow::Result<()> {
    let dns_names: Vec<&str> = args.dns_names.iter().map(String::as_str).collect();
    let pki = TestPki::generate(&dns_names).context("generating test PKI")?;
    pki.write_ca(&args.ca_out)?;
    let config = MockFcmConfig {
        bind: args.bind,
        latency: Duration::from_millis(args.latency_ms),
        project_id: args.project_id,
        ..Default::default()
    };
    let mock = start_mock_fcm(&pki, config).await?;
    mock.service_account().write(&args.service_account_out)?;
    println!("mock FCM listening on {} (token endpoint {})", mock.base_url(), mock.token_uri());
    args.outage.apply(mock.outage())?;
    println!("engine configuration:\n");
    println!("[engine.channels.fcm]");
    println!("service_account_file = {:?}", args.service_account_out.display().to_string());
    println!("base_url = {:?}", mock.base_url());
    println!("extra_ca_files = [{:?}]\n", args.ca_out.display().to_string());
    report_until_ctrl_c(|| mock.received_count()).await?;
    println!("token requests: {}", mock.token_request_count());
    print_outage_count(mock.outage());
    mock.shutdown().await;
    Ok(())
}

/// The three mocks side by side; Ctrl-C stops all of them.
async fn mock_all(args: AllArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.dir).with_context(|| format!("creating {}", args.dir.display()))?;
    let webhook = WebhookArgs {
        bind: "127.0.0.1:8443".parse()?,
        ca_out: args.dir.join("mock-ca.pem"),
        http1_only: false,
        latency_ms: args.latency_ms,
        status: 200,
        dns_names: vec![],
        outage: OutageArgs::default(),
    };
    let apns = ApnsArgs {
        bind: "127.0.0.1:8444".parse()?,
        ca_out: args.dir.join("mock-apns-ca.pem"),
        key_out: args.dir.join("mock-apns-key.p8"),
        key_id: "KEY1234567".into(),
        team_id: "TEAM123456".into(),
        latency_ms: args.latency_ms,
        dns_names: vec![],
        outage: OutageArgs::default(),
    };
    let fcm = FcmArgs {
        bind: "127.0.0.1:8445".parse()?,
        ca_out: args.dir.join("mock-fcm-ca.pem"),
        service_account_out: args.dir.join("mock-fcm-service-account.json"),
        project_id: "fanout-test-project".into(),
        latency_ms: args.latency_ms,
        dns_names: vec![],
        outage: OutageArgs::default(),
    };
    tokio::try_join!(mock_webhook(webhook), mock_apns(apns), mock_fcm(fcm))?;
    Ok(())
}

async fn mock_webhook(args: WebhookArgs) -> anyhow::Result<()> {
    let dns_names: Vec<&str> = args.dns_names.iter().map(String::as_str).collect();
    let pki = TestPki::generate(&dns_names).context("generating test PKI")?;
    pki.write_ca(&args.ca_out)?;

    let mut config = if args.http1_only { MockWebhookConfig::http1_only() } else { MockWebhookConfig::default() };
    config.bind = args.bind;
    config.latency = Duration::from_millis(args.latency_ms);
    config.default_status = args.status;

    let mock = start_mock_webhook(&pki, config).await?;
    println!("mock webhook listening on {}", mock.url("/"));
    println!("CA certificate written to {}", args.ca_out.display());
    args.outage.apply(mock.outage())?;

    report_until_ctrl_c(|| mock.received_count()).await?;
    print_outage_count(mock.outage());
    mock.shutdown().await;
    Ok(())
}
