//! The TLS ClientHello parser (SNI routing) on arbitrary bytes.
//!
//! Never panics; a parsed hello's SNI is a non-empty DNS-style name; and every strict
//! prefix of input that parses to a hello is `Incomplete` (so reads split anywhere give the
//! same answer in the end).
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_core::codec::tls_client_hello::{parse, Parsed};

fuzz_target!(|data: &[u8]| {
    let Ok(Parsed::Hello(hello)) = parse(data) else {
        return;
    };
    if let Some(name) = hello.sni() {
        assert!(!name.is_empty());
        assert!(name
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_')));
    }
    // The shortest prefix that parses is the hello; everything shorter is Incomplete.
    let end = (0..=data.len())
        .find(|&n| matches!(parse(&data[..n]), Ok(Parsed::Hello(_))))
        .expect("the whole input parses");
    for cut in [0, end / 2, end.saturating_sub(1)] {
        if cut < end {
            assert_eq!(parse(&data[..cut]), Ok(Parsed::Incomplete), "prefix {cut}");
        }
    }
    assert_eq!(parse(&data[..end]), Ok(Parsed::Hello(hello)));
});
