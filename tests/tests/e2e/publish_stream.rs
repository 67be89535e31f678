//! `PublishStream`: one acknowledgement per batch, in
//! order, as each is stored; open as long as the client keeps it; ended by
//! the server only after the acknowledgements of every stored batch.

use std::time::Duration;

use fanout_proto::v1 as pb;
use fanout_tests::EngineConfig;
use fanout_tests::client::{Recipient, envelope, group_topic, subscription};
use pb::EnvelopeKind as K;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::common::*;

/// How long an acknowledgement may take on loopback.
const ACK_WAIT: Duration = Duration::from_secs(10);

/// An open stream: batches go in through `batches`, acknowledgements come out of `acks`.
struct Stream {
    batches: mpsc::Sender<pb::PublishRequest>,
    acks: Streaming<pb::PublishResponse>,
}

impl Stream {
    async fn open(publisher: &mut pb::publish_service_client::PublishServiceClient<tonic::transport::Channel>) -> Self {
        let (batches, rx) = mpsc::channel(4);
        let acks = publisher.publish_stream(ReceiverStream::new(rx)).await.expect("open the stream").into_inner();
        Self { batches, acks }
    }

    async fn send(&self, envelopes: Vec<pb::Envelope>) {
        self.batches.send(pb::PublishRequest { envelopes }).await.expect("the stream takes a batch");
    }

    async fn ack(&mut self) -> pb::PublishResponse {
        tokio::time::timeout(ACK_WAIT, self.acks.message())
            .await
            .expect("an acknowledgement in time")
            .expect("no error status")
            .expect("the stream is still open")
    }
}

fn env(name: &str, value: &str) -> (String, String) {
    (name.to_owned(), value.to_owned())
}

#[tokio::test]
async fn each_batch_is_acknowledged_as_it_is_stored_and_the_stream_outlives_the_call_deadline() {
    // A one-second deadline for calls: the stream must not be cut by it.
    let config =
        EngineConfig { env: vec![env("FANOUT__SERVER__GRPC_REQUEST_TIMEOUT_SECONDS", "1")], ..Default::default() };
    let setup = webhook_setup(config).await;
    let topic = group_topic();
    let recipient = Recipient::random();
    register_webhook(&setup, &recipient, "/stream", &[0x31u8; 32], vec![subscription(&topic)]).await;
    let mut publisher = setup.fanout.publisher().await.expect("publisher");
    let mut stream = Stream::open(&mut publisher).await;

    let mut last = 0;
    for batch in 1..=4usize {
        // Batch n carries n envelopes, the second of them invalid.
        let mut envelopes: Vec<pb::Envelope> = (0..batch).map(|_| envelope(&topic, K::Application, true)).collect();
        if batch >= 2 {
            envelopes[1].kind = 0;
        }
        stream.send(envelopes).await;
        let ack = stream.ack().await;
        assert_eq!(ack.results.len(), batch, "the acknowledgement of batch {batch} answers its envelopes");
        for (i, result) in ack.results.iter().enumerate() {
            if i == 1 {
                assert!(matches!(result.result, Some(pb::publish_result::Result::Error(_))), "{result:?}");
            } else {
                let seq = sequence_id(result);
                assert!(seq > last, "stored in order across batches");
                last = seq;
            }
        }
        if batch == 2 {
            // Idle for longer than the call deadline, then carry on.
            tokio::time::sleep(Duration::from_millis(2500)).await;
        }
    }
    drop(stream.batches);
    let end = tokio::time::timeout(ACK_WAIT, stream.acks.message()).await.expect("the stream ends");
    assert!(matches!(end, Ok(None)), "ends with OK once the client closed its side: {end:?}");

    // 1 + 1 + 2 + 3 stored envelopes, each delivered.
    let got = setup.receiver.wait_for(7, DELIVERY_WAIT).await;
    assert_eq!(got.len(), 7, "engine log:\n{}", setup.fanout.log());
}

#[tokio::test]
async fn at_shutdown_a_stream_ends_with_unavailable_after_its_acknowledgements() {
    let mut setup = webhook_setup(EngineConfig::default()).await;
    let topic = group_topic();
    let mut publisher = setup.fanout.publisher().await.expect("publisher");
    let mut stream = Stream::open(&mut publisher).await;
    stream.send(vec![envelope(&topic, K::Application, true)]).await;
    sequence_id(&stream.ack().await.results[0]);

    let pid = setup.fanout.pid().expect("running");
    std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().expect("kill -TERM");
    let end = tokio::time::timeout(ACK_WAIT, stream.acks.message()).await.expect("the stream ends");
    let status = end.expect_err("an error status");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("shutting down"), "{status:?}");
    // Said in its details too: nothing sent after the last ack was stored.
    assert!(fanout_proto::routing::is_shutting_down(&status), "{status:?}");
    let exit = setup.fanout.terminate().expect("exits");
    assert!(exit.success(), "exit status {exit}; log:\n{}", setup.fanout.log());
}

#[tokio::test]
async fn streams_beyond_the_per_connection_limit_wait_for_a_free_one() {
    let config =
        EngineConfig { env: vec![env("FANOUT__SERVER__GRPC_MAX_CONCURRENT_STREAMS", "1")], ..Default::default() };
    let setup = webhook_setup(config).await;
    let topic = group_topic();
    // One client, one connection: its two streams share it.
    let mut publisher = setup.fanout.publisher().await.expect("publisher");
    let mut first = Stream::open(&mut publisher).await;
    first.send(vec![envelope(&topic, K::Application, true)]).await;
    first.ack().await;

    let mut second_client = publisher.clone();
    let second = tokio::spawn(async move {
        let mut second = Stream::open(&mut second_client).await;
        second.send(vec![envelope(&topic, K::Application, true)]).await;
        second.ack().await
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!second.is_finished(), "the second stream waits while the first holds the connection's only stream");

    drop(first.batches);
    assert!(matches!(first.acks.message().await, Ok(None)));
    let ack = tokio::time::timeout(ACK_WAIT, second).await.expect("in time").expect("the second stream ran");
    sequence_id(&ack.results[0]);
}
