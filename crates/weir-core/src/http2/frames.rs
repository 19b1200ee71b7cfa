//! Frame boundaries in the bytes of an HTTP/2 connection, seen as they pass through the
//! connection's I/O (`io::Prefixed`), for the defences the `h2` crate has no hook for.
//!
//! The `h2` crate answers PINGs and SETTINGS, ignores PRIORITY and unknown frames and
//! accepts empty DATA and tiny WINDOW_UPDATEs without telling its user, and it sends the
//! resets a client's errors force (MadeYouReset) on its own. Weir does not decode frames a
//! second time: a [`Scanner`] walks frame headers only (9 bytes, plus the 4 first payload
//! bytes of WINDOW_UPDATE and RST_STREAM), skipping payloads by length, with no copy and
//! no allocation, and says what each frame is (and, outbound, how many DATA payload bytes
//! of which stream went: `outbox`). [`Glitches`] judges client frames, [`forced_reset`]
//! the resets Weir sends.

/// A frame header, with the first 32-bit word of the payload when it was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub len: usize,
    /// The stream identifier (0: the connection).
    pub stream: u32,
    /// WINDOW_UPDATE's increment or RST_STREAM's error code, or the pad length of a
    /// PADDED DATA frame (`None`: a shorter payload, which the `h2` crate refuses as a
    /// FRAME_SIZE_ERROR anyway, or another kind).
    pub word: Option<u32>,
}

const DATA: u8 = 0;
const PRIORITY: u8 = 2;
pub const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const WINDOW_UPDATE: u8 = 8;
const CONTINUATION: u8 = 9;
const END_STREAM: u8 = 0x1;
const PADDED: u8 = 0x8;
const ACK: u8 = 0x1;
const HEADER_LEN: usize = 9;

/// Error codes of resets that are no client's fault (RFC 9113 section 7).
const NO_ERROR: u32 = 0;
const CANCEL: u32 = 8;

const HEADERS: u8 = 1;

/// WINDOW_UPDATEs a client may send before any DATA: one for the connection and one for
/// a stream, to open windows larger than the default.
const START_UPDATES: u32 = 2;

/// At most this many WINDOW_UPDATEs are explained ahead (a client's updates lag its DATA
/// by a few batches at most), so a long download does not buy a later flood.
const MAX_UPDATE_CREDIT: u32 = 4096;

/// A WINDOW_UPDATE increment below this is tiny: granted while Weir has DATA waiting for
/// window, such increments make Weir cut its data into tiny frames (the data dribble of
/// CVE-2019-9511). Real clients release window in halves or quarters of it.
const TINY_UPDATE: u32 = 1024;

/// Walks the frames of one direction of a connection, fed its bytes in order.
#[derive(Debug)]
pub struct Scanner {
    /// Bytes still to skip: the client preface at the start, then each frame's payload.
    skip: usize,
    /// The frame header being assembled, plus the payload word for some kinds.
    head: [u8; HEADER_LEN + 4],
    have: usize,
    want: usize,
    /// The stream of the DATA frame whose payload is being skipped (0: no DATA frame).
    data_of: u32,
}

impl Scanner {
    /// A scanner whose first frame starts after `skip` bytes (the 24-byte client preface
    /// on the inbound side, 0 outbound).
    pub fn new(skip: usize) -> Scanner {
        Scanner {
            skip,
            head: [0; HEADER_LEN + 4],
            have: 0,
            want: HEADER_LEN,
            data_of: 0,
        }
    }

    /// Feeds the next bytes of the direction; calls `on_frame` for each frame header
    /// completed in them.
    #[inline]
    pub fn feed(&mut self, bytes: &[u8], on_frame: impl FnMut(Frame)) {
        self.feed_data(bytes, on_frame, |_, _| {});
    }

    /// As [`Scanner::feed`], and calls `on_data(stream, n)` for each run of `n` DATA
    /// payload bytes of `stream` in them (as they pass, not when the header does: a
    /// frame may be written in pieces).
    #[inline]
    pub fn feed_data(
        &mut self,
        mut bytes: &[u8],
        mut on_frame: impl FnMut(Frame),
        mut on_data: impl FnMut(u32, usize),
    ) {
        loop {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                if self.data_of != 0 && n > 0 {
                    on_data(self.data_of, n);
                }
            }
            if bytes.is_empty() {
                return;
            }
            let n = (self.want - self.have).min(bytes.len());
            self.head[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have < self.want {
                return;
            }
            let h = &self.head;
            let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
            let (kind, flags) = (h[3], h[4]);
            let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
            // The payload bytes wanted: a 32-bit word, or a PADDED DATA frame's pad length.
            let word_len = match kind {
                WINDOW_UPDATE | RST_STREAM if len >= 4 => 4,
                DATA if flags & PADDED != 0 && len >= 1 => 1,
                _ => 0,
            };
            if self.want == HEADER_LEN && word_len > 0 {
                self.want = HEADER_LEN + word_len;
                continue;
            }
            let word = match self.want - HEADER_LEN {
                4 => Some(u32::from_be_bytes([h[9], h[10], h[11], h[12]])),
                1 => Some(u32::from(h[9])),
                _ => None,
            };
            on_frame(Frame {
                kind,
                flags,
                len,
                stream,
                word,
            });
            self.skip = len - (self.want - HEADER_LEN);
            self.data_of = if kind == DATA { stream } else { 0 };
            self.have = 0;
            self.want = HEADER_LEN;
        }
    }
}

/// Takes one off `credit`; whether there was none to take.
#[inline]
fn spent(credit: &mut u32) -> bool {
    let Some(left) = credit.checked_sub(1) else {
        return true;
    };
    *credit = left;
    false
}

/// Tells glitches among a client's frames: work for Weir that carries no request (floods
/// of CVE-2019-9512 PING, -9515 SETTINGS, -9518 empty DATA (padded or not), PRIORITY
/// (-9513), unknown frame types, which the `h2` crate reads and ignores, PING ACKs for
/// PINGs Weir never sent, WINDOW_UPDATEs that no DATA explains, and tiny WINDOW_UPDATEs
/// while Weir's last DATA was cut short by the window, CVE-2019-9511).
///
/// A PING is explained when Weir sent HEADERS or DATA since the client's previous PING:
/// gRPC clients measure the bandwidth-delay product with a PING per round trip while
/// data arrives (BDP pings), so only PINGs on a connection where nothing happens count.
///
/// A client releases window for DATA it received: at most one stream and one connection
/// WINDOW_UPDATE for each DATA frame Weir sent (plus one per stream it opens and two at
/// the start, to open windows wider than the default). Their sizes vary with timing (the
/// `h2` crate's client sends small ones when the window is nearly spent), so the count is
/// what is judged, not the size.
#[derive(Debug)]
pub struct Glitches {
    /// The first client frame is the SETTINGS every client must send: no glitch.
    first: bool,
    /// WINDOW_UPDATEs the DATA sent so far explains.
    update_credit: u32,
    /// Weir sent HEADERS or DATA since the client's last PING: the next PING is explained.
    sent_since_ping: bool,
    /// PINGs Weir sent whose ACK is still to come.
    pings_out: u32,
    /// Weir's last DATA frame was tiny and left the stream open: it was cut to a tiny
    /// window (or the upstream sends tiny pieces), so a tiny WINDOW_UPDATE feeds a dribble.
    tiny_data: bool,
}

impl Default for Glitches {
    fn default() -> Glitches {
        Glitches {
            first: true,
            update_credit: START_UPDATES,
            sent_since_ping: false,
            pings_out: 0,
            tiny_data: false,
        }
    }
}

impl Glitches {
    /// Whether the client frame `f` is a glitch.
    #[inline]
    pub fn inbound(&mut self, f: &Frame) -> bool {
        let first = std::mem::take(&mut self.first);
        match f.kind {
            DATA => is_empty_data(f) && f.flags & END_STREAM == 0,
            HEADERS => {
                self.update_credit = (self.update_credit + 1).min(MAX_UPDATE_CREDIT);
                false
            }
            SETTINGS => f.flags & ACK == 0 && !first,
            PING if f.flags & ACK != 0 => spent(&mut self.pings_out),
            PING => !std::mem::take(&mut self.sent_since_ping),
            PRIORITY => true,
            WINDOW_UPDATE => self.window_update(f),
            kind => kind > CONTINUATION,
        }
    }

    fn window_update(&mut self, f: &Frame) -> bool {
        let tiny = self.tiny_data && f.word.is_some_and(|n| n < TINY_UPDATE);
        spent(&mut self.update_credit) || tiny
    }

    /// Notes a frame Weir sent: DATA explains two WINDOW_UPDATEs, HEADERS or DATA the
    /// client's next PING.
    #[inline]
    pub fn outbound(&mut self, f: &Frame) {
        match f.kind {
            DATA => {
                if f.len > 0 {
                    self.update_credit = (self.update_credit + 2).min(MAX_UPDATE_CREDIT);
                }
                self.tiny_data = f.len < TINY_UPDATE as usize && f.flags & END_STREAM == 0;
                self.sent_since_ping = true;
            }
            HEADERS => self.sent_since_ping = true,
            PING if f.flags & ACK == 0 => self.pings_out = self.pings_out.saturating_add(1),
            _ => {}
        }
    }
}

/// DATA with no data: no payload, or only padding (PADDED, payload = pad length + pad).
#[inline]
fn is_empty_data(f: &Frame) -> bool {
    match f.word {
        Some(pad) if f.flags & PADDED != 0 => f.len == 1 + pad as usize,
        _ => f.len == 0,
    }
}

/// Whether an outbound frame is a reset forced by the client: RST_STREAM with an error
/// code (PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED, REFUSED_STREAM, ...), which the
/// `h2` crate or Weir sends because of something the client did on that stream
/// (MadeYouReset, CVE-2025-8671). NO_ERROR and CANCEL are Weir's own choices.
#[inline]
pub fn forced_reset(f: &Frame) -> bool {
    f.kind == RST_STREAM && !matches!(f.word, Some(NO_ERROR | CANCEL))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut out = len.to_be_bytes()[1..].to_vec();
        out.extend_from_slice(&[kind, flags]);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn sample() -> (Vec<u8>, Vec<Frame>) {
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        let mut want = Vec::new();
        let mut push = |kind, flags, payload: &[u8], word| {
            bytes.extend(frame(kind, flags, 1, payload));
            want.push(Frame {
                kind,
                flags,
                len: payload.len(),
                stream: 1,
                word,
            });
        };
        push(SETTINGS, 0, &[0, 3, 0, 0, 0, 100], None);
        push(PING, 0, &[7; 8], None);
        push(WINDOW_UPDATE, 0, &[0, 0, 0, 10], Some(10));
        push(DATA, 0, &[], None);
        push(DATA, END_STREAM, &[1; 300], None);
        push(RST_STREAM, 0, &[0, 0, 0, 1], Some(1));
        push(0xee, 0, &[], None);
        push(WINDOW_UPDATE, 0, &[0, 1], None);
        // Only padding, then one byte of data and padding, then a short PADDED frame.
        push(DATA, PADDED, &[3, 0, 0, 0], Some(3));
        push(DATA, PADDED, &[1, b'x', 0], Some(1));
        push(DATA, PADDED | END_STREAM, &[0], Some(0));
        (bytes, want)
    }

    #[test]
    fn finds_every_frame_split_at_every_byte() {
        let (bytes, want) = sample();
        for cut in 0..=bytes.len() {
            let mut s = Scanner::new(24);
            let mut got = Vec::new();
            s.feed(&bytes[..cut], |f| got.push(f));
            s.feed(&bytes[cut..], |f| got.push(f));
            assert_eq!(got, want, "cut {cut}");
        }
        // And byte by byte.
        let mut s = Scanner::new(24);
        let mut got = Vec::new();
        for b in &bytes {
            s.feed(std::slice::from_ref(b), |f| got.push(f));
        }
        assert_eq!(got, want);
    }

    #[test]
    fn counts_data_payload_bytes_per_stream_split_at_every_byte() {
        let mut bytes = frame(HEADERS, 0, 1, &[0; 7]);
        bytes.extend(frame(DATA, 0, 1, &[1; 300]));
        bytes.extend(frame(DATA, END_STREAM, 3, &[]));
        bytes.extend(frame(PING, 0, 0, &[7; 8]));
        bytes.extend(frame(DATA, END_STREAM, 5, &[2; 20]));
        for cut in 0..=bytes.len() {
            let mut s = Scanner::new(0);
            let mut data = Vec::new();
            for part in [&bytes[..cut], &bytes[cut..]] {
                s.feed_data(part, |_| {}, |id, n| data.push((id, n)));
            }
            let sum = |id| {
                data.iter()
                    .filter(|d| d.0 == id)
                    .map(|d| d.1)
                    .sum::<usize>()
            };
            assert_eq!(
                (sum(1), sum(3), sum(5), sum(0)),
                (300, 0, 20, 0),
                "cut {cut}"
            );
        }
    }

    fn of(kind: u8, flags: u8, len: usize) -> Frame {
        Frame {
            kind,
            flags,
            len,
            stream: 1,
            word: None,
        }
    }

    #[test]
    fn judges_glitches_and_forced_resets() {
        let (_, frames) = sample();
        let mut g = Glitches::default();
        let glitches: Vec<bool> = frames.iter().map(|f| g.inbound(f)).collect();
        // The first SETTINGS is no glitch, nor are the first two WINDOW_UPDATEs; padding
        // alone is empty DATA.
        assert_eq!(
            glitches,
            [false, true, false, true, false, false, true, false, true, false, false]
        );
        let mut g = Glitches::default();
        assert!(!g.inbound(&of(SETTINGS, 0, 6)));
        assert!(g.inbound(&of(SETTINGS, 0, 6)), "a second SETTINGS");
        assert!(!g.inbound(&of(SETTINGS, ACK, 0)));
        let update = of(WINDOW_UPDATE, 0, 4);
        // Two at the start, one per stream opened, two per DATA frame sent.
        assert!(!g.inbound(&of(HEADERS, 0, 20)));
        for _ in 0..3 {
            assert!(!g.inbound(&update));
        }
        assert!(g.inbound(&update), "no DATA explains it");
        g.outbound(&of(DATA, 0, 100));
        g.outbound(&of(DATA, END_STREAM, 0));
        assert!(!g.inbound(&update));
        assert!(!g.inbound(&update));
        assert!(g.inbound(&update));
        // A long download buys at most MAX_UPDATE_CREDIT updates ahead.
        for _ in 0..100_000 {
            g.outbound(&of(DATA, 0, 1));
        }
        for _ in 0..MAX_UPDATE_CREDIT {
            assert!(!g.inbound(&update));
        }
        assert!(g.inbound(&update));
        let resets: Vec<bool> = frames.iter().map(forced_reset).collect();
        assert_eq!(resets.len(), frames.len());
        assert_eq!(resets.iter().filter(|r| **r).count(), 1);
        let cancel = Frame {
            kind: RST_STREAM,
            flags: 0,
            len: 4,
            stream: 1,
            word: Some(CANCEL),
        };
        assert!(!forced_reset(&cancel));
    }

    fn padded(len: usize, pad: u32) -> Frame {
        Frame {
            kind: DATA,
            flags: PADDED,
            len,
            stream: 1,
            word: Some(pad),
        }
    }

    #[test]
    fn padding_alone_is_empty_data() {
        let mut g = Glitches::default();
        assert!(g.inbound(&padded(1, 0)));
        assert!(g.inbound(&padded(6, 5)));
        assert!(!g.inbound(&padded(6, 4)), "one byte of data");
        let mut end = padded(6, 5);
        end.flags |= END_STREAM;
        assert!(!g.inbound(&end), "it ends the stream");
    }

    #[test]
    fn a_ping_is_explained_by_headers_or_data_sent_since_the_last() {
        let mut g = Glitches::default();
        let ping = of(PING, 0, 8);
        assert!(!g.inbound(&of(SETTINGS, 0, 0)));
        assert!(g.inbound(&ping), "nothing sent yet");
        g.outbound(&of(HEADERS, 0, 10));
        assert!(!g.inbound(&ping), "after the response head");
        assert!(g.inbound(&ping), "a second PING, nothing sent since");
        // A BDP ping per round trip of a long download is never a glitch.
        for _ in 0..10_000 {
            g.outbound(&of(DATA, 0, 16_384));
            g.outbound(&of(DATA, 0, 16_384));
            assert!(!g.inbound(&ping));
        }
        // Control frames Weir sends explain nothing.
        g.outbound(&of(SETTINGS, ACK, 0));
        g.outbound(&of(PING, ACK, 8));
        assert!(g.inbound(&ping));
    }

    #[test]
    fn a_ping_ack_is_a_glitch_unless_weir_pinged() {
        let mut g = Glitches::default();
        let ack = of(PING, ACK, 8);
        assert!(!g.inbound(&of(SETTINGS, 0, 0)));
        assert!(g.inbound(&ack), "Weir sent no PING");
        g.outbound(&of(PING, 0, 8));
        assert!(!g.inbound(&ack));
        assert!(g.inbound(&ack), "one ACK per PING");
    }

    #[test]
    fn tiny_window_updates_are_glitches_while_data_is_cut_to_them() {
        let update = |n: u32| Frame {
            kind: WINDOW_UPDATE,
            flags: 0,
            len: 4,
            stream: 1,
            word: Some(n),
        };
        let mut g = Glitches::default();
        assert!(!g.inbound(&of(SETTINGS, 0, 0)));
        assert!(!g.inbound(&of(HEADERS, 0, 20)));
        // After full frames, small updates are fine (credit allowing).
        g.outbound(&of(DATA, 0, 16_384));
        assert!(!g.inbound(&update(1)));
        assert!(!g.inbound(&update(32_768)));
        // A 1-byte DATA frame answered with a 1-byte window: a dribble.
        for _ in 0..100 {
            g.outbound(&of(DATA, 0, 1));
            assert!(g.inbound(&update(1)));
        }
        // A generous update after a small frame is fine, and so is any after the end.
        g.outbound(&of(DATA, 0, 1));
        assert!(!g.inbound(&update(65_535)));
        g.outbound(&of(DATA, END_STREAM, 1));
        assert!(!g.inbound(&update(1)));
    }
}
