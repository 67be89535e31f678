//! `fanout-loadtest`: load harness and standalone mock providers.
//!
//! Only `mock webhook` exists so far; `run`, `ceiling` and `mock apns|fcm|all`
//! will be added as further subcommands.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use fanout_loadtest::{MockWebhookConfig, TestPki, start_mock_webhook};

#[derive(Parser)]
#[command(
    name = "fanout-loadtest",
    about = "Load harness and mock providers for fanout"
)]
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
}

#[derive(Subcommand)]
enum MockTarget {
    /// HTTPS webhook receiver (HTTP/1.1 and HTTP/2) that records and answers requests.
    Webhook(WebhookArgs),
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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Mock {
            target: MockTarget::Webhook(args),
        } => mock_webhook(args).await,
    }
}

async fn mock_webhook(args: WebhookArgs) -> anyhow::Result<()> {
    let dns_names: Vec<&str> = args.dns_names.iter().map(String::as_str).collect();
    let pki = TestPki::generate(&dns_names).context("generating test PKI")?;
    pki.write_ca(&args.ca_out)?;

    let mut config = if args.http1_only {
        MockWebhookConfig::http1_only()
    } else {
        MockWebhookConfig::default()
    };
    config.bind = args.bind;
    config.latency = Duration::from_millis(args.latency_ms);
    config.default_status = args.status;

    let mock = start_mock_webhook(&pki, config).await?;
    println!("mock webhook listening on {}", mock.url("/"));
    println!("CA certificate written to {}", args.ca_out.display());

    let mut ticker = tokio::time::interval(Duration::from_secs(5));
    ticker.tick().await; // the first tick fires at once
    loop {
        tokio::select! {
            _ = ticker.tick() => println!("received {} requests", mock.received_count()),
            result = tokio::signal::ctrl_c() => {
                result.context("waiting for Ctrl-C")?;
                break;
            }
        }
    }
    println!(
        "stopping; received {} requests in total",
        mock.received_count()
    );
    mock.shutdown().await;
    Ok(())
}
