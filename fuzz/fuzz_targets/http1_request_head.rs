//! The request-head parser on arbitrary bytes, with small limits chosen by the fuzzer.
//!
//! Never panics, on the whole input or on any prefix of it; an accepted head stays inside
//! the input and the limits; a shorter prefix of an accepted head is only ever "incomplete";
//! a reused `RequestHead` gives the same answer as a fresh one; an accepted target has no `#`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_core::codec::http1::{parse_request, BodyFraming, HeadLimits, RequestHead};

fuzz_target!(|data: &[u8]| {
    let [a, b, input @ ..] = data else { return };
    let limits = HeadLimits {
        max_header_size: 16 + usize::from(*a) * 8, // 16 ..= 2056 bytes
        max_headers: usize::from(*b % 40),         // 0 ..= 39, also 0
    };
    let mut head = RequestHead::default();
    let whole = parse_request(input, limits, &mut head);
    if let Ok(true) = whole {
        check_accepted(input, limits, &head);
        // Every strict prefix of an accepted head is incomplete: never accepted, never refused.
        for cut in 0..head.head_len {
            let mut partial = RequestHead::default();
            assert_eq!(
                parse_request(&input[..cut], limits, &mut partial),
                Ok(false)
            );
        }
    } else {
        for cut in 0..input.len() {
            let mut partial = RequestHead::default();
            if let Ok(true) = parse_request(&input[..cut], limits, &mut partial) {
                panic!("a prefix of a rejected or incomplete head was accepted");
            }
        }
    }
    // Reusing the head (as a client connection does) must not change the answer.
    let mut reused = RequestHead::default();
    let _ = parse_request(b"POST http://x/ HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nConnection: upgrade\r\nUpgrade: w\r\nContent-Length: 5\r\n\r\n", limits, &mut reused);
    let again = parse_request(input, limits, &mut reused);
    assert_eq!(again, whole);
    if let Ok(true) = again {
        assert_eq!(reused.head_len, head.head_len);
        assert_eq!(reused.framing, head.framing);
        assert_eq!(reused.host, head.host);
        assert_eq!(reused.headers, head.headers);
        assert_eq!(reused.upgrade, head.upgrade);
        assert_eq!(reused.expect_continue, head.expect_continue);
        assert_eq!(reused.target_authority, head.target_authority);
    }
});

fn check_accepted(input: &[u8], limits: HeadLimits, head: &RequestHead) {
    let n = head.head_len;
    assert!(n <= input.len() && n <= limits.max_header_size);
    assert!(head.headers.len() <= limits.max_headers);
    let within = |r: &std::ops::Range<usize>| r.start <= r.end && r.end <= n;
    assert!(within(&head.method) && !head.method.is_empty());
    assert!(within(&head.path));
    for h in &head.headers {
        assert!(within(&h.name) && within(&h.value) && !h.name.is_empty());
    }
    if let Some(r) = &head.host {
        assert!(within(r) && !r.is_empty());
    }
    if let Some(r) = &head.target_authority {
        assert!(within(r));
    }
    assert!(head.minor_version <= 1);
    assert_ne!(
        head.framing,
        BodyFraming::UntilClose,
        "requests are never close-delimited"
    );
    if head.framing == BodyFraming::Chunked {
        assert_eq!(head.minor_version, 1, "chunked only in HTTP/1.1");
    }
    let method = &input[head.method.clone()];
    assert_ne!(method, b"CONNECT");
    assert_eq!(head.is_head, method == b"HEAD");
    let path = &input[head.path.clone()];
    assert!(
        path.first() == Some(&b'/')
            || path == b"*"
            || (path.is_empty() && head.target_authority.is_some()),
        "target form"
    );
    // No target form has a fragment (RFC 9112 3.2): it would end the path for the backend only.
    assert!(!path.contains(&b'#'), "fragment accepted");
    if let Some(r) = &head.target_authority {
        assert!(!input[r.clone()].contains(&b'#'), "fragment accepted");
    }
    if head.minor_version == 1 {
        assert!(head.host.is_some(), "HTTP/1.1 needs a host");
    }
    let _ = head.host_name(input);
}
