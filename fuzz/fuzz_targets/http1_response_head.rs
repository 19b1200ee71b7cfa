//! The response-head parser on arbitrary bytes: never panics (whole input and every prefix);
//! an accepted head stays inside the input (every range, the reason phrase included);
//! shorter prefixes of it are only "incomplete".
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_core::codec::http1::{parse_response, BodyFraming, ResponseHead};

fuzz_target!(|data: &[u8]| {
    let [a, input @ ..] = data else { return };
    let request_is_head = a & 1 == 1;
    let max_head = 16 + usize::from(a >> 1) * 16; // 16 ..= 2048 bytes
    let mut head = ResponseHead::default();
    let whole = parse_response(input, max_head, request_is_head, &mut head);
    if let Ok(true) = whole {
        let n = head.head_len;
        assert!(n <= input.len());
        assert!((100..=999).contains(&head.status));
        assert!(head.minor_version <= 1);
        let within = |r: &std::ops::Range<usize>| r.start <= r.end && r.end <= n;
        assert!(within(&head.reason));
        for h in &head.headers {
            assert!(within(&h.name) && within(&h.value));
        }
        let bodiless = request_is_head
            || (100..200).contains(&head.status)
            || head.status == 204
            || head.status == 304;
        if bodiless {
            assert_eq!(head.framing, BodyFraming::None);
        }
        if head.framing == BodyFraming::UntilClose {
            assert!(!head.keeps_alive());
        }
        let _ = head.is_interim();
        // A prefix that already fills `max_head` is refused as too large even when the whole
        // head (longer than max_head) is accepted: harmless in Weir, whose upstream buffer is
        // exactly max_head long, so only shorter prefixes are compared.
        for cut in 0..n.min(max_head) {
            let mut partial = ResponseHead::default();
            assert_eq!(
                parse_response(&input[..cut], max_head, request_is_head, &mut partial),
                Ok(false)
            );
        }
    } else {
        for cut in 0..input.len() {
            let mut partial = ResponseHead::default();
            let r = parse_response(&input[..cut], max_head, request_is_head, &mut partial);
            assert!(
                !matches!(r, Ok(true)),
                "a prefix was accepted, the whole was not"
            );
        }
    }
});
