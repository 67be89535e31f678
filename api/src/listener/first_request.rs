//! The deadline from accept to a connection's first request. A connection
//! that has not sent, by then, a complete HTTP/1 request head or the HTTP/2
//! client preface followed by its first SETTINGS frame is cut: nothing else
//! bounds that phase (hyper's protocol sniffing has no timer, HTTP/2
//! keep-alive pings start after the preface), so idle or dripping
//! connections would otherwise hold the listener's slots for ever.
//!
//! The bytes are watched as they are read, above TLS; nothing is buffered
//! or changed. Once the first request is in, the wrapper only forwards.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::activity::Activity;
use super::metrics::{CloseReason, Closes};

/// RFC 9113 §3.4: what every HTTP/2 client sends first.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const SETTINGS: u8 = 0x4;

/// How far the first request has come, byte by byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    /// Every byte so far matches the first `n` of the HTTP/2 preface.
    Undecided(usize),
    /// HTTP/2: `n` bytes of the first frame header, which must be SETTINGS.
    FrameHeader(usize, [u8; FRAME_HEADER]),
    /// HTTP/2: bytes of the SETTINGS payload still to come.
    Settings(u32),
    /// HTTP/1: the head ends at an empty line after some content (leading
    /// empty lines are ignored, RFC 9112 §2.2).
    Head {
        content: bool,
        line_feed: bool,
    },
    Complete,
}

impl Progress {
    fn feed(mut self, bytes: &[u8]) -> Progress {
        let mut at = 0;
        while at < bytes.len() {
            let byte = bytes[at];
            at += 1;
            self = match self {
                Progress::Undecided(n) if byte == PREFACE[n] => match n + 1 {
                    24 => Progress::FrameHeader(0, [0; FRAME_HEADER]),
                    n => Progress::Undecided(n),
                },
                // Not HTTP/2: what came so far starts an HTTP/1 head.
                Progress::Undecided(n) => {
                    Progress::Head { content: false, line_feed: false }.feed(&PREFACE[..n]).feed(&[byte])
                }
                Progress::FrameHeader(n, mut header) => {
                    header[n] = byte;
                    if n + 1 < FRAME_HEADER {
                        Progress::FrameHeader(n + 1, header)
                    } else {
                        let length = u32::from_be_bytes([0, header[0], header[1], header[2]]);
                        // Another frame first is a protocol error that
                        // HTTP/2 itself answers: nothing to wait for.
                        if header[3] != SETTINGS || length == 0 {
                            Progress::Complete
                        } else {
                            Progress::Settings(length)
                        }
                    }
                }
                Progress::Settings(remaining) => {
                    // This byte and as many more of the payload as are here.
                    let taken = (remaining as usize - 1).min(bytes.len() - at);
                    at += taken;
                    match remaining - 1 - taken as u32 {
                        0 => Progress::Complete,
                        remaining => Progress::Settings(remaining),
                    }
                }
                Progress::Head { content, line_feed } => match byte {
                    b'\n' if content && line_feed => Progress::Complete,
                    b'\n' => Progress::Head { content, line_feed: true },
                    b'\r' => Progress::Head { content, line_feed },
                    _ => Progress::Head { content: true, line_feed: false },
                },
                Progress::Complete => Progress::Complete,
            };
            if self == Progress::Complete {
                break;
            }
        }
        self
    }
}

/// A connection's IO with the first-request deadline on its reads.
pub struct FirstRequest<I> {
    io: I,
    progress: Progress,
    /// `None` once the first request is in.
    deadline: Option<Pin<Box<Sleep>>>,
    activity: Arc<Activity>,
    closes: Closes,
}

impl<I> FirstRequest<I> {
    pub fn new(io: I, deadline: Instant, activity: Arc<Activity>, closes: Closes) -> Self {
        FirstRequest {
            io,
            progress: Progress::Undecided(0),
            deadline: Some(Box::pin(tokio::time::sleep_until(deadline))),
            activity,
            closes,
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for FirstRequest<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let Some(deadline) = this.deadline.as_mut() else {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        };
        // Checked before every read, so a client dripping a byte at a time
        // is cut as surely as a silent one.
        if deadline.as_mut().poll(cx).is_ready() {
            this.deadline = None;
            this.closes.count(CloseReason::FirstRequestTimeout);
            tracing::debug!("connection closed: no first request within the deadline");
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "no first request within the deadline")));
        }
        let filled = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            this.progress = this.progress.feed(&buf.filled()[filled..]);
            if this.progress == Progress::Complete {
                this.deadline = None;
                this.activity.first_request_in();
            }
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for FirstRequest<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// The HTTP/2 preface and a SETTINGS frame with one setting.
    fn http2_start() -> Vec<u8> {
        let mut bytes = PREFACE.to_vec();
        bytes.extend_from_slice(&[0, 0, 6, SETTINGS, 0, 0, 0, 0, 0]);
        bytes.extend_from_slice(&[0, 3, 0, 0, 0, 100]);
        bytes
    }

    fn fed_one_by_one(bytes: &[u8]) -> Vec<Progress> {
        let mut progress = Progress::Undecided(0);
        bytes
            .iter()
            .map(|b| {
                progress = progress.feed(std::slice::from_ref(b));
                progress
            })
            .collect()
    }

    #[test]
    fn http2_is_in_after_the_preface_and_its_settings_frame() {
        let start = http2_start();
        assert_eq!(Progress::Undecided(0).feed(&start), Progress::Complete);
        let steps = fed_one_by_one(&start);
        assert!(steps[..start.len() - 1].iter().all(|p| *p != Progress::Complete), "{steps:?}");
        assert_eq!(steps.last(), Some(&Progress::Complete));
        // The preface alone, or with part of the frame, is not enough.
        assert_ne!(Progress::Undecided(0).feed(&start[..24]), Progress::Complete);
        assert_ne!(Progress::Undecided(0).feed(&start[..35]), Progress::Complete);
        // An empty SETTINGS frame completes it at its header.
        let mut empty = PREFACE.to_vec();
        empty.extend_from_slice(&[0, 0, 0, SETTINGS, 0, 0, 0, 0, 0]);
        assert_eq!(Progress::Undecided(0).feed(&empty), Progress::Complete);
    }

    #[test]
    fn http1_is_in_at_the_end_of_its_head() {
        let head = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
        let steps = fed_one_by_one(head);
        assert!(steps[..head.len() - 1].iter().all(|p| *p != Progress::Complete));
        assert_eq!(steps.last(), Some(&Progress::Complete));
        assert_eq!(Progress::Undecided(0).feed(b"GET / HTTP/1.0\n\n"), Progress::Complete);
        // Empty lines before the request line do not count as a head.
        assert_ne!(Progress::Undecided(0).feed(b"\r\n\r\n\r\n"), Progress::Complete);
        assert_ne!(Progress::Undecided(0).feed(b"GET / HTTP/1.1\r\nHost: x\r\n"), Progress::Complete);
        // Starting like the HTTP/2 preface, then not: HTTP/1 from the first byte.
        assert_eq!(Progress::Undecided(0).feed(b"PRI * HTTP/2.0\r\nX: y\r\n\r\n"), Progress::Complete);
    }

    fn wrapped(deadline: Duration) -> (FirstRequest<tokio::io::DuplexStream>, tokio::io::DuplexStream, Closes) {
        let (server, client) = tokio::io::duplex(1024);
        let closes = Closes::unregistered();
        let io = FirstRequest::new(server, Instant::now() + deadline, Arc::new(Activity::new()), closes.clone());
        (io, client, closes)
    }

    #[tokio::test(start_paused = true)]
    async fn a_dripping_client_is_cut_at_the_deadline_and_counted() {
        let (mut server, mut client, closes) = wrapped(Duration::from_secs(10));
        let reader = tokio::spawn(async move {
            let mut sink = Vec::new();
            let ended = server.read_to_end(&mut sink).await;
            (ended.map_err(|e| e.kind()), tokio::time::Instant::now())
        });
        let started = Instant::now();
        // One byte of the preface a second: never enough.
        for byte in PREFACE.iter().take(20) {
            if client.write_all(std::slice::from_ref(byte)).await.is_err() {
                break; // closed by the server
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let (ended, at) = reader.await.unwrap();
        assert_eq!(ended, Err(io::ErrorKind::TimedOut));
        assert_eq!(at, started + Duration::from_secs(10));
        assert_eq!(closes.get(CloseReason::FirstRequestTimeout), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_in_time_is_never_cut_afterwards() {
        let (mut server, mut client, closes) = wrapped(Duration::from_secs(10));
        client.write_all(&http2_start()).await.unwrap();
        let mut buf = vec![0; 64];
        let n = server.read(&mut buf).await.unwrap();
        assert_eq!(n, http2_start().len());
        // Long after the deadline, reads go on.
        tokio::time::sleep(Duration::from_secs(60)).await;
        client.write_all(b"more").await.unwrap();
        assert_eq!(server.read(&mut buf).await.unwrap(), 4);
        assert_eq!(closes.get(CloseReason::FirstRequestTimeout), 0);
    }
}
