//! Two devices of two people against a running `fanout serve`:
//!
//! 1. a local HTTPS webhook receiver (the testkit's mock, with a CA kept in
//!    the example's directory so the engine can trust it);
//! 2. Alice's and Bob's devices, each a `NotificationClient` with a JSON
//!    state file, enable webhook notifications, join two groups and sync;
//! 3. Alice publishes to one group with a sender HMAC: Bob's device is
//!    woken, Alice's is not; Bob answers: Alice's device is woken, Bob's not;
//! 4. Bob's phone reports its zone as `Europe/Kiev`, an alias in tzdb
//!    2025b: his quiet-hours schedule is written with the canonical name
//!    (`dnd::canonical_zone_name`), which every reader accepts;
//! 5. both disable again.
//!
//! First run (writes `fanout.toml` and the CA, and says how to start fanout):
//!
//! ```sh
//! cargo run -p fanout-client --example two_devices
//! cargo run -p fanout-api -- serve --config fanout-client-example/fanout.toml
//! cargo run -p fanout-client --example two_devices      # in another shell
//! ```
//!
//! Options: `--dir DIR` (default `fanout-client-example`), `--fanout URL`
//! (default `http://127.0.0.1:50051`), `--launch` (build and start the
//! engine itself, on free ports, for a one-command demo).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail};
use fanout_client::dnd::{DndSetting, canonical_zone_name};
use fanout_client::{
    BackendConfig, ClientConfig, ConsentState, Conversation, ConversationKind, Conversations, DeliveryTarget, Error,
    GroupId, HostParts, JsonFileStore, Keys, NotificationClient, Outgoing, Publisher, RootKey, RuleOptions,
    TokioRunner, Topic, Trigger,
};
use fanout_testkit::launcher::{Engine, Launch, build_binary};
use fanout_testkit::{MockWebhook, MockWebhookConfig, TestPki, start_mock_webhook};
use rand::RngCore;

/// One person's app on one device: its conversations and keys.
struct Device {
    name: &'static str,
    conversations: Mutex<Vec<Conversation>>,
    root: RootKey,
    welcome: Topic,
}

impl Conversations for Device {
    fn conversations(&self) -> Result<Vec<Conversation>, Error> {
        Ok(self.conversations.lock().unwrap().clone())
    }
}

impl Keys for Device {
    fn root_key(&self) -> Result<Option<RootKey>, Error> {
        Ok(Some(self.root.clone()))
    }

    fn welcome_topic(&self) -> Result<Topic, Error> {
        Ok(self.welcome.clone())
    }
}

fn random<const N: usize>() -> [u8; N] {
    let mut b = [0; N];
    rand::rng().fill_bytes(&mut b);
    b
}

struct Options {
    dir: PathBuf,
    fanout: String,
    launch: bool,
}

fn options() -> anyhow::Result<Options> {
    let mut o = Options { dir: "fanout-client-example".into(), fanout: "http://127.0.0.1:50051".into(), launch: false };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--dir" => o.dir = args.next().context("--dir needs a value")?.into(),
            "--fanout" => o.fanout = args.next().context("--fanout needs a value")?,
            "--launch" => o.launch = true,
            other => bail!("unknown argument {other:?} (use --dir DIR, --fanout URL, --launch)"),
        }
    }
    Ok(o)
}

/// The engine config the demo needs: the webhook channel, allowed to reach
/// the receiver on 127.0.0.1 (development only) and trusting its CA.
fn engine_tables(dir: &Path) -> String {
    format!(
        "[engine.channels.http]\n# DANGEROUS outside development: the example's receiver is on 127.0.0.1.\n\
         allow_private_addresses = true\nextra_ca_files = [{:?}]\n",
        dir.join("ca.pem").display().to_string()
    )
}

fn write_config(dir: &Path) -> anyhow::Result<PathBuf> {
    let path = dir.join("fanout.toml");
    let config = format!(
        "[server]\ngrpc_listen = \"127.0.0.1:50051\"\n\n[store]\npath = {:?}\n\n{}",
        dir.join("data").display().to_string(),
        engine_tables(dir)
    );
    std::fs::write(&path, config)?;
    Ok(path)
}

async fn wait_for_wakeup(receiver: &MockWebhook, path: &str, sequence_id: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < deadline {
        if wakeups(receiver, path).iter().any(|s| s == sequence_id) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("no wake-up for {sequence_id} at {path} within 30 s")
}

/// The sequence ids pushed to `path`, signatures checked by the receiver.
fn wakeups(receiver: &MockWebhook, path: &str) -> Vec<String> {
    receiver
        .received()
        .into_iter()
        .filter(|r| r.path == path && r.signature_valid == Some(true))
        .filter_map(|r| r.json()?["sequence_id"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let o = options()?;
    std::fs::create_dir_all(&o.dir)?;
    let dir = o.dir.canonicalize()?;
    let pki = TestPki::load_or_generate(&dir)?;

    let mut _engine = None;
    let fanout = if o.launch {
        println!("building and starting fanout ...");
        let launch = Launch::new(build_binary(false)?, engine_tables(&dir));
        let engine = Engine::start(launch).await?;
        let url = format!("http://{}", engine.grpc);
        _engine = Some(engine);
        url
    } else {
        let config = write_config(&dir)?;
        println!("fanout must run with {} (written now):", config.display());
        println!("  cargo run -p fanout-api -- serve --config {}", config.display());
        o.fanout
    };

    let receiver = start_mock_webhook(&pki, MockWebhookConfig::default()).await?;
    println!("webhook receiver at {}", receiver.url("/"));

    // Two groups both people are in, fresh for each run.
    let design = GroupId::new(random::<16>().to_vec())?;
    let lunch = GroupId::new(random::<16>().to_vec())?;
    let mut devices = Vec::new();
    for name in ["alice", "bob"] {
        let device = Arc::new(Device {
            name,
            conversations: Mutex::new(Vec::new()),
            root: RootKey::new(&random::<42>())?,
            welcome: Topic::welcome(&random::<16>())?,
        });
        let store = Arc::new(JsonFileStore::new(dir.join(format!("{name}.json"))));
        let parts = HostParts::new(store, device.clone(), device.clone(), Arc::new(TokioRunner::current()));
        let client = NotificationClient::new(ClientConfig::new(fanout.clone()), parts)?;
        client.start();

        let path = format!("/{name}");
        let signing_key = random::<32>().to_vec();
        receiver.set_signing_key(&path, signing_key.clone());
        let target = DeliveryTarget::Http { url: receiver.url(&path), signing_key };
        let state = client
            .enable(target, RuleOptions::default())
            .await
            .with_context(|| format!("{name}: enable (is fanout running at {fanout}?)"))?;
        println!(
            "{name}: enabled, recipient {} (the same on every run)",
            hex::encode(&client.stored().identity.unwrap().id()[..4])
        );
        println!("{name}: Register -> topic_count {}, channel {:?}", state.topic_count, state.channel);

        // The app joins two groups and tells the client (PUSH-260 triggers).
        for group in [&design, &lunch] {
            device.conversations.lock().unwrap().push(Conversation {
                group_id: group.clone(),
                kind: ConversationKind::Group,
                active_member: true,
                consent: ConsentState::Allowed,
            });
            client.changed(Trigger::GroupCreated);
        }
        let report = client.sync_now().await?;
        // The background loop may have sent some of it already (enable and
        // each trigger wake it): the uploaded set is the result either way.
        let uploaded = client.stored().uploaded.len();
        println!(
            "{name}: synced, {uploaded} topics uploaded (2 groups, the welcome topic); this run sent {:?}",
            report.updates
        );
        let publisher = Publisher::new(&BackendConfig::new(fanout.clone()), device.clone())?;
        devices.push((device, client, publisher, path));
    }

    let (alice, bob) = (&devices[0], &devices[1]);
    let from_alice = alice
        .2
        .publish(&design, b"<ciphertext: lunch at 1?>".to_vec(), Outgoing::Application { should_push: None })
        .await?;
    println!("{}: published {from_alice} to the design group, with a sender HMAC", alice.0.name);
    wait_for_wakeup(&receiver, &bob.3, &from_alice.to_string()).await?;
    println!("{}: woken for {from_alice}", bob.0.name);

    let from_bob =
        bob.2.publish(&design, b"<ciphertext: yes>".to_vec(), Outgoing::Application { should_push: None }).await?;
    println!("{}: published {from_bob}", bob.0.name);
    wait_for_wakeup(&receiver, &alice.3, &from_bob.to_string()).await?;
    println!("{}: woken for {from_bob}", alice.0.name);

    let (alice_woken, bob_woken) = (wakeups(&receiver, &alice.3), wakeups(&receiver, &bob.3));
    println!("alice's device was woken for {alice_woken:?}, bob's for {bob_woken:?}");
    if alice_woken != [from_bob.to_string()] || bob_woken != [from_alice.to_string()] {
        bail!("a device was woken by its own message");
    }
    println!("neither device was woken by its own message: sender suppression works");

    // Bob's quiet hours, in the zone his phone reports. Spec 002 §7 refuses
    // aliases in a schedule, so the app maps the reported name first.
    let reported = "Europe/Kiev";
    let zone = canonical_zone_name(reported).with_context(|| format!("{reported} is no tzdb 2025b zone"))?;
    let schedule = serde_json::json!({"dnd": {
        "enabled": true,
        "schedule": {"timezone": zone, "tzdb_version": "2025b", "all_day": false,
                     "periods": [{"start": "22:00", "end": "07:00"}]},
        "exceptions": [],
    }});
    let mut dnd = DndSetting::default();
    dnd.update(schedule.to_string().as_bytes())?;
    println!("{}: phone reports {reported}; quiet hours 22:00-07:00 stored in {zone}", bob.0.name);

    for (device, client, _, _) in &devices {
        client.disable().await?;
        println!("{}: disabled ({:?})", device.name, client.state());
    }
    Ok(())
}
