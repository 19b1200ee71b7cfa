//! The PROXY protocol parser on arbitrary bytes.
//!
//! Never panics; a header's length lies within the input; every strict prefix of a complete
//! header is `Incomplete` (so feeding it in pieces gives the same answer); and a header that
//! carries addresses encodes back (v1 and v2) to bytes that parse to the same addresses.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_config::ProxyVersion;
use weir_core::codec::proxy_protocol::{encode, parse, Parsed};

fuzz_target!(|data: &[u8]| {
    let Ok(Parsed::Header { len, addresses }) = parse(data) else {
        return;
    };
    assert!(len <= data.len(), "header longer than the input");
    for cut in [0, len / 2, len - 1] {
        assert_eq!(parse(&data[..cut]), Ok(Parsed::Incomplete), "prefix {cut}");
    }
    let Some(a) = addresses else { return };
    for version in [ProxyVersion::V1, ProxyVersion::V2] {
        let header = encode(version, a).expect("on");
        let bytes = header.as_bytes();
        match parse(bytes) {
            Ok(Parsed::Header { len, addresses: Some(b) }) => {
                assert_eq!(len, bytes.len());
                // Mixed families come back as IPv4-mapped IPv6; equal families exactly.
                if a.source.is_ipv4() == a.destination.is_ipv4() {
                    assert_eq!(a, b);
                }
            }
            other => panic!("re-encoded header did not parse: {other:?}"),
        }
    }
});
