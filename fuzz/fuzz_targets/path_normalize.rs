//! The request-path normaliser on arbitrary bytes, under settings chosen by the fuzzer.
//!
//! Never panics; a normalised path starts with `/`, keeps the query byte for byte, has no
//! `.` or `..` segment left (with `dot_segments`) and no `//` (with `merge_slashes`), and
//! normalising it again changes nothing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_config::{EncodedSlash, PathNormalization};
use weir_core::router::normalize::normalize_into;

fuzz_target!(|data: &[u8]| {
    let [flags, target @ ..] = data else { return };
    let settings = PathNormalization {
        dot_segments: flags & 1 != 0,
        merge_slashes: flags & 2 != 0,
        encoded_slash: match (flags >> 2) % 3 {
            0 => EncodedSlash::Reject,
            1 => EncodedSlash::Keep,
            _ => EncodedSlash::Decode,
        },
    };
    let mut out = Vec::new();
    let Ok(true) = normalize_into(target, &settings, &mut out) else {
        return;
    };
    assert_eq!(out.first(), Some(&b'/'));
    let split = |t: &[u8]| t.iter().position(|b| *b == b'?').unwrap_or(t.len());
    assert_eq!(&out[split(&out)..], &target[split(target)..], "query changed");
    let path = &out[..split(&out)];
    if settings.dot_segments {
        let dot = |s: &[u8]| s == b"." || s == b"..";
        assert!(!path.split(|b| *b == b'/').any(dot), "dot segment left");
    }
    if settings.merge_slashes {
        assert!(!path.windows(2).any(|w| w == b"//"), "// left");
    }
    let mut again = Vec::new();
    assert_eq!(normalize_into(&out, &settings, &mut again), Ok(false));
});
