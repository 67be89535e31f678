//! What an HTTP/2 client put on the wire, as a mock server read it after TLS:
//! bytes, requests (request header blocks), HPACK header-block bytes, DATA
//! bytes, and the bytes of `authorization` literals. The mock APNs reports
//! bytes per request with it, so a header that costs every request
//! shows up as a figure rather than a guess.
//!
//! [`Tap`] wraps a connection's stream and feeds every byte read to a frame
//! parser (RFC 9113 §4.1); [`WireStats`] sums what the parsers of all
//! connections saw. The HPACK walk (RFC 7541 §6) reads representations and
//! string lengths only, never the dynamic table or Huffman codes: enough to
//! find literals named by static index 23, `authorization`.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The client connection preface (RFC 9113 §3.4).
const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// HPACK static table index of `authorization` (RFC 7541 Appendix A).
const AUTHORIZATION: u64 = 23;
/// A header block longer than this is counted but not walked.
const MAX_BLOCK: usize = 64 * 1024;

/// Totals over every connection of one server.
#[derive(Debug, Default)]
pub struct WireStats {
    bytes: AtomicU64,
    requests: AtomicU64,
    header_block_bytes: AtomicU64,
    data_bytes: AtomicU64,
    authorization_bytes: AtomicU64,
}

/// A snapshot of [`WireStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct WireCounts {
    /// Every byte the clients sent, after TLS (preface, settings, pings, frames).
    pub bytes: u64,
    /// Complete request header blocks (HEADERS and its CONTINUATIONs).
    pub requests: u64,
    /// HPACK header-block bytes of those requests, as received.
    pub header_block_bytes: u64,
    /// DATA frame payloads (request bodies).
    pub data_bytes: u64,
    /// Bytes of the header blocks' `authorization` literals (static name
    /// index 23); an `authorization` sent as a 1-byte index into the dynamic
    /// table is not counted.
    pub authorization_bytes: u64,
}

impl WireCounts {
    /// `n` ÷ requests, 0 without requests.
    pub fn per_request(&self, n: u64) -> f64 {
        if self.requests == 0 { 0.0 } else { n as f64 / self.requests as f64 }
    }
}

impl WireStats {
    pub fn counts(&self) -> WireCounts {
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        WireCounts {
            bytes: load(&self.bytes),
            requests: load(&self.requests),
            header_block_bytes: load(&self.header_block_bytes),
            data_bytes: load(&self.data_bytes),
            authorization_bytes: load(&self.authorization_bytes),
        }
    }

    fn add(n: &AtomicU64, by: usize) {
        n.fetch_add(by as u64, Ordering::Relaxed);
    }
}

/// Where the parser is in the byte stream of one connection.
#[derive(Debug)]
struct FrameParser {
    preface_left: usize,
    header: [u8; FRAME_HEADER_LEN],
    header_filled: usize,
    /// Bytes of the current frame's payload still to come.
    payload_left: usize,
    frame_type: u8,
    flags: u8,
    /// The current HEADERS or CONTINUATION payload, kept whole.
    payload: Vec<u8>,
    /// The header block being assembled across HEADERS and CONTINUATIONs.
    block: Vec<u8>,
    block_too_long: bool,
}

impl FrameParser {
    fn new() -> Self {
        FrameParser {
            preface_left: PREFACE_LEN,
            header: [0; FRAME_HEADER_LEN],
            header_filled: 0,
            payload_left: 0,
            frame_type: 0,
            flags: 0,
            payload: Vec::new(),
            block: Vec::new(),
            block_too_long: false,
        }
    }

    fn feed(&mut self, mut bytes: &[u8], stats: &WireStats) {
        WireStats::add(&stats.bytes, bytes.len());
        while !bytes.is_empty() {
            if self.preface_left > 0 {
                let n = self.preface_left.min(bytes.len());
                self.preface_left -= n;
                bytes = &bytes[n..];
            } else if self.header_filled < FRAME_HEADER_LEN {
                let n = (FRAME_HEADER_LEN - self.header_filled).min(bytes.len());
                self.header[self.header_filled..self.header_filled + n].copy_from_slice(&bytes[..n]);
                self.header_filled += n;
                bytes = &bytes[n..];
                if self.header_filled == FRAME_HEADER_LEN {
                    let h = &self.header;
                    self.payload_left = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
                    (self.frame_type, self.flags) = (h[3], h[4]);
                    self.payload.clear();
                    if self.payload_left == 0 {
                        self.frame_done(stats);
                    }
                }
            } else {
                let n = self.payload_left.min(bytes.len());
                match self.frame_type {
                    HEADERS | CONTINUATION if self.payload.len() + n <= MAX_BLOCK => {
                        self.payload.extend_from_slice(&bytes[..n]);
                    }
                    HEADERS | CONTINUATION => self.block_too_long = true,
                    DATA => WireStats::add(&stats.data_bytes, n),
                    _ => {}
                }
                self.payload_left -= n;
                bytes = &bytes[n..];
                if self.payload_left == 0 {
                    self.frame_done(stats);
                }
            }
        }
    }

    /// A whole frame is in: take its header-block fragment, and at
    /// END_HEADERS account the block.
    fn frame_done(&mut self, stats: &WireStats) {
        self.header_filled = 0;
        let fragment = match self.frame_type {
            HEADERS => headers_fragment(&self.payload, self.flags),
            CONTINUATION => Some(&self.payload[..]),
            _ => return,
        };
        match fragment {
            Some(f) if self.block.len() + f.len() <= MAX_BLOCK => self.block.extend_from_slice(f),
            _ => self.block_too_long = true,
        }
        if self.flags & END_HEADERS != 0 {
            WireStats::add(&stats.requests, 1);
            WireStats::add(&stats.header_block_bytes, self.block.len());
            if !self.block_too_long {
                WireStats::add(&stats.authorization_bytes, authorization_bytes(&self.block));
            }
            self.block.clear();
            self.block_too_long = false;
        }
    }
}

/// A HEADERS payload without its pad length, priority fields and padding
/// (RFC 9113 §6.2); `None` when the flags do not fit the payload.
fn headers_fragment(payload: &[u8], flags: u8) -> Option<&[u8]> {
    let mut start = 0;
    let mut pad = 0;
    if flags & PADDED != 0 {
        pad = usize::from(*payload.first()?);
        start = 1;
    }
    if flags & PRIORITY != 0 {
        start += 5;
    }
    payload.get(start..payload.len().checked_sub(pad)?)
}

/// An HPACK integer with an `prefix`-bit prefix (RFC 7541 §5.1) at the start
/// of `bytes`: its value and length.
fn integer(bytes: &[u8], prefix: u32) -> Option<(u64, usize)> {
    let max = (1u64 << prefix) - 1;
    let first = u64::from(*bytes.first()?) & max;
    if first < max {
        return Some((first, 1));
    }
    let (mut value, mut shift) = (max, 0u32);
    for (i, byte) in bytes.iter().enumerate().skip(1) {
        value = value.checked_add(u64::from(byte & 0x7f).checked_shl(shift)?)?;
        if byte & 0x80 == 0 {
            return Some((value, i + 1));
        }
        shift += 7;
        if shift > 56 {
            return None;
        }
    }
    None
}

/// The length of an HPACK string literal (RFC 7541 §5.2) at the start of `bytes`.
fn string_len(bytes: &[u8]) -> Option<usize> {
    let (len, n) = integer(bytes, 7)?;
    let end = n.checked_add(usize::try_from(len).ok()?)?;
    (end <= bytes.len()).then_some(end)
}

/// Bytes of the literal representations in `block` whose name is static
/// index 23 (`authorization`); stops at the first malformed representation.
fn authorization_bytes(block: &[u8]) -> usize {
    let mut at = 0;
    let mut total = 0;
    while at < block.len() {
        let rest = &block[at..];
        let first = rest[0];
        // RFC 7541 §6: indexed (1xxxxxxx), literal with incremental indexing
        // (01xxxxxx, 6-bit index), table size update (001xxxxx), literal
        // without or never indexed (000xxxxx, 4-bit index).
        let step = if first & 0x80 != 0 {
            integer(rest, 7).map(|(_, n)| (n, false))
        } else if first & 0x20 != 0 && first & 0x40 == 0 {
            integer(rest, 5).map(|(_, n)| (n, false))
        } else {
            let prefix = if first & 0x40 != 0 { 6 } else { 4 };
            integer(rest, prefix).and_then(|(index, n)| {
                let name_end = if index == 0 { n + string_len(&rest[n..])? } else { n };
                let end = name_end + string_len(&rest[name_end..])?;
                Some((end, index == AUTHORIZATION))
            })
        };
        let Some((n, is_authorization)) = step else {
            break;
        };
        if is_authorization {
            total += n;
        }
        at += n;
    }
    total
}

/// A connection's stream that tells `stats` what the client sent.
pub struct Tap<S> {
    inner: S,
    parser: FrameParser,
    stats: Arc<WireStats>,
}

impl<S> Tap<S> {
    pub fn new(inner: S, stats: Arc<WireStats>) -> Self {
        Tap { inner, parser: FrameParser::new(), stats }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tap<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut me.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            me.parser.feed(&buf.filled()[before..], &me.stats);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tap<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(frame_type: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, frame_type, flags, 0, 0, 0, 1];
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn hpack_integers_and_strings() {
        // RFC 7541 C.1: 10 in a 5-bit prefix; 1337 in a 5-bit prefix; 42 at an octet boundary.
        assert_eq!(integer(&[0b0000_1010], 5), Some((10, 1)));
        assert_eq!(integer(&[0b0001_1111, 0b1001_1010, 0b0000_1010], 5), Some((1337, 3)));
        assert_eq!(integer(&[42], 8), Some((42, 1)));
        assert_eq!(integer(&[0b0001_1111, 0x80], 5), None, "cut off");
        assert_eq!(string_len(&[0x03, b'a', b'b', b'c', 0xff]), Some(4));
        assert_eq!(string_len(&[0x05, b'a']), None);
    }

    #[test]
    fn authorization_literals_are_found_by_static_index() {
        // RFC 7541 C.3.1: :method GET, :scheme http, :path /, :authority
        // www.example.com: no authorization.
        let c31 = hex::decode("828684410f7777772e6578616d706c652e636f6d").unwrap();
        assert_eq!(authorization_bytes(&c31), 0);
        // Never indexed, name index 23 (4-bit prefix: 15 + 8), value "bearer x.y" (10 bytes).
        let mut never = vec![0x1f, 0x08, 0x0a];
        never.extend_from_slice(b"bearer x.y");
        assert_eq!(authorization_bytes(&never), 13);
        // Without indexing (0000xxxx), after a table size update and an
        // indexed field; then a literal with incremental indexing, index 23
        // (6-bit prefix) and a Huffman-flagged value.
        let mut block = vec![0x3f, 0xe1, 0x1f, 0x82, 0x0f, 0x08, 0x02, b'a', b'b'];
        block.extend_from_slice(&[0x57, 0x83, 1, 2, 3]);
        block.extend_from_slice(&[0x44, 0x01, b'/']); // :path literal, not counted
        assert_eq!(authorization_bytes(&block), 5 + 5);
        // A literal with a new name is walked over, not counted.
        let new_name = [0x10, 0x01, b'x', 0x01, b'y', 0x1f, 0x08, 0x00];
        assert_eq!(authorization_bytes(&new_name), 3);
        // Malformed: stops without counting garbage.
        assert_eq!(authorization_bytes(&[0x1f, 0x08, 0x7f]), 0);
    }

    #[test]
    fn frames_split_anywhere_are_counted_once() {
        let mut auth = vec![0x82, 0x1f, 0x08, 0x03];
        auth.extend_from_slice(b"abc");
        // HEADERS with padding and priority, a CONTINUATION, a DATA frame.
        let mut padded = vec![2u8, 0, 0, 0, 0, 0];
        padded.extend_from_slice(&auth[..3]);
        padded.extend_from_slice(&[0, 0]);
        let mut wire = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        wire.extend(frame(0x4, 0, &[])); // SETTINGS
        wire.extend(frame(HEADERS, PADDED | PRIORITY, &padded));
        wire.extend(frame(CONTINUATION, END_HEADERS, &auth[3..]));
        wire.extend(frame(DATA, 0x1, b"{\"aps\":{}}"));
        wire.extend(frame(HEADERS, END_HEADERS, &[0x82]));
        for chunk in [1, 2, 7, 1000] {
            let stats = WireStats::default();
            let mut parser = FrameParser::new();
            for piece in wire.chunks(chunk) {
                parser.feed(piece, &stats);
            }
            let c = stats.counts();
            assert_eq!(c.bytes, wire.len() as u64, "chunk {chunk}");
            assert_eq!((c.requests, c.header_block_bytes, c.data_bytes), (2, 7 + 1, 10), "chunk {chunk}");
            assert_eq!(c.authorization_bytes, 6, "chunk {chunk}");
            assert_eq!(c.per_request(c.header_block_bytes), 4.0);
        }
    }
}
