//! The chunked decoder on arbitrary bytes, fed in two pieces split where the fuzzer says.
//!
//! Never panics; always makes progress (a call on non-empty input consumes something unless
//! the message is done); data spans lie inside the consumed bytes; when it reports done, the
//! consumed bytes are at most the input; and the split never changes the outcome compared to
//! feeding the input in one piece.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_core::codec::http1::ChunkedDecoder;

#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    consumed: usize,
    data: Vec<u8>,
    done: bool,
    error: bool,
    body_len: u64,
}

fn run(pieces: &[&[u8]]) -> Outcome {
    let mut dec = ChunkedDecoder::new();
    let mut out = Outcome {
        consumed: 0,
        data: Vec::new(),
        done: false,
        error: false,
        body_len: 0,
    };
    'pieces: for piece in pieces {
        let mut rest: &[u8] = piece;
        while !rest.is_empty() {
            if dec.is_done() {
                break 'pieces;
            }
            match dec.decode(rest) {
                Ok(d) => {
                    assert!(d.consumed <= rest.len(), "consumed more than given");
                    if let Some(r) = d.data {
                        assert!(
                            r.start <= r.end && r.end <= d.consumed,
                            "data outside consumed"
                        );
                        out.data.extend_from_slice(&rest[r]);
                    }
                    assert!(d.consumed > 0 || dec.is_done(), "no progress");
                    out.consumed += d.consumed;
                    rest = &rest[d.consumed..];
                }
                Err(_) => {
                    out.error = true;
                    break 'pieces;
                }
            }
        }
    }
    if out.error {
        // How many framing bytes were counted before the error depends on the split; only
        // the fact of the error (and the data before it) must not.
        out.consumed = 0;
    }
    out.done = dec.is_done();
    out.body_len = dec.body_len();
    assert!(out.data.len() as u64 <= out.body_len || out.error || out.body_len == u64::MAX);
    out
}

fuzz_target!(|data: &[u8]| {
    let [a, b, input @ ..] = data else { return };
    let split = usize::from(u16::from_le_bytes([*a, *b])) % (input.len() + 1);
    let (first, second) = input.split_at(split);
    let two = run(&[first, second]);
    if two.done {
        assert!(two.consumed <= input.len());
    }
    if !two.error {
        assert!(two.consumed <= input.len());
    }
    let one = run(&[input]);
    assert_eq!(one, two, "split at {split} changed the outcome");
    // Byte by byte, for short inputs.
    if input.len() <= 256 {
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(run(&bytes), one, "byte-by-byte feeding changed the outcome");
    }
});
