//! The scenarios, one per seed report: what runs behind the proxies, which proxies, which
//! loads, and what a correct answer looks like.

use serde::Serialize;

use crate::backend::BackendKind;
use crate::load::Load;
use crate::peers::{Peer, Route};

/// Scenario names on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
pub enum Name {
    /// Seeds 001, 004: one proxy core, 615-byte backend, wrk at 6..512 connections.
    #[value(name = "proxy-1core")]
    Proxy1Core,
    /// Seed 000: /cgi/ prefix routing to a slow backend at 400 and 96 connections.
    #[value(name = "cgi-prefix")]
    CgiPrefix,
    /// Seed 002: ab GET and POST at 100, 1000 and 10,000 connections against the default
    /// backend.
    #[value(name = "default-backend")]
    DefaultBackend,
    /// Seed 003: three echo backends, ab -c 300, direct vs nginx vs Weir.
    #[value(name = "round-robin")]
    RoundRobin,
    /// Fixed-rate latency percentiles, corrected for coordinated omission.
    #[value(name = "latency")]
    Latency,
    /// Keep-alive TLS clients (wrk over https; h2load -c 32 -m 16 over ALPN h2) in front
    /// of the 615-byte nginx backend, Weir vs nginx with the same ECDSA P-256 certificate.
    #[value(name = "tls-proxy")]
    TlsProxy,
    /// h2load -c 32 -m 16 over h2c (prior knowledge) in front of the 615-byte nginx
    /// backend: Weir vs nginx `listen ... http2` and HAProxy `bind ... proto h2`.
    #[value(name = "h2c")]
    H2c,
    /// Unary gRPC calls (h2load posting one small message) over h2c to an h2c gRPC-ish
    /// backend: Weir `protocol = "h2c"` vs nginx `grpc_pass` and HAProxy `proto h2`.
    #[value(name = "grpc")]
    Grpc,
    /// A new TLS connection per request, answered by the proxy itself: TLS 1.3 and 1.2,
    /// ECDSA P-256 and RSA-2048, full and resumed; CPU per handshake, Weir vs nginx vs
    /// HAProxy.
    #[value(name = "tls-handshake")]
    TlsHandshake,
    /// 1 MiB responses over keep-alive TLS (wrk -c 8) from an nginx file backend: bytes
    /// per proxy CPU-second, Weir vs nginx vs HAProxy.
    #[value(name = "tls-bulk")]
    TlsBulk,
    /// Keep-alive TLS at fixed request rates (the open-loop generator over TLS 1.3, 32
    /// connections): CPU per request of each proxy at the same load, Weir vs nginx vs
    /// HAProxy.
    #[value(name = "tls-rate")]
    TlsRate,
    /// Static files, 1 KiB, keep-alive (wrk -t1): Weir `files` vs nginx `root` with
    /// `sendfile on` vs Caddy `file_server`.
    #[value(name = "static")]
    Static,
    /// The same with a 1 MiB file.
    #[value(name = "static-1m")]
    Static1m,
    /// All of the above, in this order.
    #[value(name = "all")]
    All,
}

impl Name {
    pub const EVERY: [Name; 13] = [
        Name::Proxy1Core,
        Name::CgiPrefix,
        Name::DefaultBackend,
        Name::RoundRobin,
        Name::Latency,
        Name::TlsProxy,
        Name::H2c,
        Name::Grpc,
        Name::TlsHandshake,
        Name::TlsBulk,
        Name::TlsRate,
        Name::Static,
        Name::Static1m,
    ];
}

/// Think time of the slow backend in `cgi-prefix` (the seed's CGI script forks Perl).
pub const CGI_THINK_MS: u64 = 20;

/// One scenario, ready to run.
#[derive(Debug, Clone, Serialize)]
pub struct Scenario {
    pub name: &'static str,
    pub seeds: &'static str,
    pub about: &'static str,
    pub backend: BackendKind,
    pub route: Route,
    pub path: &'static str,
    pub peers: Vec<Peer>,
    pub loads: Vec<Load>,
    /// The status a correct answer has (404 for the default backend).
    pub expect_status: u16,
    /// Compare Weir's `/metrics` request count with what the load tool sent.
    pub check_metrics: bool,
    /// The peers terminate TLS (one self-signed ECDSA P-256 certificate for all) and the
    /// load goes over https.
    pub tls: bool,
}

/// The scenario `name`; `quick` trims the loads to a smoke test.
pub fn build(name: Name, quick: bool) -> Scenario {
    let wrk = |cs: &[u32]| {
        cs.iter()
            .map(|&conns| Load::Wrk { conns })
            .collect::<Vec<_>>()
    };
    let pick = |full: Vec<Load>, q: Vec<Load>| if quick { q } else { full };
    match name {
        Name::Proxy1Core | Name::All => Scenario {
            name: "proxy-1core",
            seeds: "001, 004",
            about: "One proxy core in front of nginx returning 615 bytes; wrk -t1, keep-alive.",
            backend: BackendKind::Nginx615,
            route: Route::Proxy,
            path: "/",
            peers: vec![
                Peer::Direct,
                Peer::Weir,
                Peer::WeirObserved,
                Peer::WeirTcp,
                Peer::Nginx,
                Peer::HaproxyHttp,
                Peer::HaproxyTcp,
                Peer::Caddy,
                Peer::Apache,
            ],
            loads: pick(wrk(&[6, 16, 32, 256, 512]), wrk(&[32, 256])),
            expect_status: 200,
            check_metrics: false,
            tls: false,
        },
        Name::CgiPrefix => Scenario {
            name: "cgi-prefix",
            seeds: "000",
            about: "Prefix routing /cgi/ -> / (ProxyPass + ProxyPassReverse) to a slow backend \
                    (20 ms think time); wrk -t1 at 400 and 96 connections.",
            backend: BackendKind::Slow {
                delay_ms: CGI_THINK_MS,
            },
            route: Route::Prefix,
            path: "/cgi/cgi-bin/second.pl",
            peers: vec![Peer::Weir, Peer::Apache, Peer::Nginx],
            loads: pick(wrk(&[400, 96]), wrk(&[400])),
            expect_status: 200,
            check_metrics: false,
            tls: false,
        },
        Name::DefaultBackend => {
            let ab = |cs: &[u32]| {
                cs.iter()
                    .flat_map(|&conns| [false, true].map(|post| Load::Ab { conns, post }))
                    .collect::<Vec<_>>()
            };
            Scenario {
                name: "default-backend",
                seeds: "002",
                about: "No route matches: the proxy's own 404 \"no route\"; ab GET and POST \
                        (a new connection per request).",
                backend: BackendKind::None,
                route: Route::Default,
                path: "/page.html",
                peers: vec![
                    Peer::Weir,
                    Peer::Nginx,
                    Peer::HaproxyHttp,
                    Peer::Caddy,
                    Peer::Apache,
                ],
                // 10,000: the seed's own top load (the descriptors it needs are checked
                // before the run, `load::Tools::missing`).
                loads: pick(ab(&[100, 1000, 10_000]), ab(&[100])),
                expect_status: 404,
                check_metrics: true,
                tls: false,
            }
        }
        Name::RoundRobin => Scenario {
            name: "round-robin",
            seeds: "003",
            about: "Three echo backends, round robin; ab -c 300 (a new connection per request).",
            backend: BackendKind::Echo { count: 3 },
            route: Route::Proxy,
            path: "/pipeline",
            peers: vec![Peer::Direct, Peer::Nginx, Peer::Weir],
            loads: vec![Load::Ab {
                conns: 300,
                post: false,
            }],
            expect_status: 200,
            check_metrics: false,
            tls: false,
        },
        Name::Latency => {
            let rates = |rs: &[u32]| {
                rs.iter()
                    .map(|&rate| Load::Rate { rate, conns: 64 })
                    .collect::<Vec<_>>()
            };
            Scenario {
                name: "latency",
                seeds: "004 (its p99.9 column), at a fixed rate",
                about: "Open-loop generator at fixed rates over 64 keep-alive connections; \
                        latency from each request's intended send time (coordinated omission \
                        corrected).",
                backend: BackendKind::Nginx615,
                route: Route::Proxy,
                path: "/",
                peers: vec![
                    Peer::Direct,
                    Peer::Weir,
                    Peer::Nginx,
                    Peer::HaproxyHttp,
                    Peer::Caddy,
                    Peer::Apache,
                ],
                loads: pick(rates(&[2_000, 10_000, 25_000]), rates(&[10_000])),
                expect_status: 200,
                check_metrics: false,
                tls: false,
            }
        }
        Name::TlsProxy => Scenario {
            name: "tls-proxy",
            seeds: "issue 13 (keep-alive TLS), issue 14 (h2-proxy)",
            about: "TLS termination in front of nginx returning 615 bytes: wrk -t1 over https \
                    (keep-alive, TLS 1.3), and h2load -c 32 -m 16 over h2 (ALPN); the same \
                    self-signed ECDSA P-256 certificate for every peer.",
            backend: BackendKind::Nginx615,
            route: Route::Proxy,
            path: "/",
            peers: vec![Peer::Weir, Peer::Nginx, Peer::HaproxyHttp],
            loads: pick(
                vec![
                    Load::Wrk { conns: 32 },
                    Load::Wrk { conns: 256 },
                    Load::H2load {
                        conns: 32,
                        streams: 16,
                    },
                ],
                vec![
                    Load::Wrk { conns: 32 },
                    Load::H2load {
                        conns: 32,
                        streams: 16,
                    },
                ],
            ),
            expect_status: 200,
            check_metrics: false,
            tls: true,
        },
        Name::H2c | Name::Grpc => h2c_scenario(name),
        Name::TlsHandshake => tls_handshake(),
        Name::Static | Name::Static1m => static_files(name, quick),
        Name::TlsRate => tls_rate(quick),
        Name::TlsBulk => Scenario {
            name: "tls-bulk",
            seeds: "issue 13 (bulk TLS)",
            about: "1 MiB responses over keep-alive TLS 1.3 (wrk -t1 -c8) from an nginx file \
                    backend; bytes per proxy CPU-second = 1 MiB / CPU per request.",
            backend: BackendKind::NginxFile { bytes: BULK_BYTES },
            route: Route::Proxy,
            path: "/file.bin",
            peers: vec![Peer::Weir, Peer::Nginx, Peer::HaproxyHttp],
            loads: vec![Load::Wrk { conns: 8 }],
            expect_status: 200,
            check_metrics: false,
            tls: true,
        },
    }
}

/// `static`, `static-1m`: each proxy serves a file from the run's `site/` itself.
fn static_files(name: Name, quick: bool) -> Scenario {
    let large = name == Name::Static1m;
    let conns: &[u32] = match (large, quick) {
        (_, true) => &[32],
        (false, false) => &[32, 256],
        (true, false) => &[8, 32],
    };
    Scenario {
        name: if large { "static-1m" } else { "static" },
        seeds: "issue 27 (static files)",
        about: if large {
            "A 1 MiB file served by the proxy itself over keep-alive HTTP/1.1 (wrk -t1): \
             Weir files (sendfile past 16 KiB) vs nginx root with sendfile on vs Caddy \
             file_server."
        } else {
            "A 1 KiB file served by the proxy itself over keep-alive HTTP/1.1 (wrk -t1): \
             Weir files vs nginx root with sendfile on vs Caddy file_server."
        },
        backend: BackendKind::Files,
        route: Route::Static,
        path: if large { "/1m.bin" } else { "/1k.bin" },
        peers: vec![Peer::Weir, Peer::Nginx, Peer::Caddy],
        loads: conns.iter().map(|&conns| Load::Wrk { conns }).collect(),
        expect_status: 200,
        check_metrics: false,
        tls: false,
    }
}

/// The size of a `tls-bulk` response.
pub const BULK_BYTES: u64 = 1 << 20;

/// `tls-handshake`: every combination of version, key and resumption from a client that
/// offers what browsers offer, then TLS 1.3 ECDSA full handshakes from an OpenSSL-like
/// client (X25519) and a P-256-only one, and ab over https; 8 connections at a time, each
/// one request long.
fn tls_handshake() -> Scenario {
    use crate::handshakes::{Kind, Profile};
    let mut loads = Vec::new();
    for tls13 in [true, false] {
        for rsa in [false, true] {
            for resume in [false, true] {
                let kind = Kind {
                    tls13,
                    rsa,
                    resume,
                    profile: Profile::Browser,
                };
                loads.push(Load::Handshake { conns: 8, kind });
            }
        }
    }
    for profile in [Profile::Openssl, Profile::P256] {
        let kind = Kind {
            tls13: true,
            rsa: false,
            resume: false,
            profile,
        };
        loads.push(Load::Handshake { conns: 8, kind });
    }
    // ab's OpenSSL client sends its request in a write of its own after the handshake, so
    // the server reads the client's Finished alone and waits once more per connection.
    loads.push(Load::Ab {
        conns: 8,
        post: false,
    });
    Scenario {
        name: "tls-handshake",
        seeds: "issue 13 (handshakes)",
        about: "A new TLS connection per request (weir-bench handshakes: rustls client \
                offering what browsers offer, X25519MLKEM768 + X25519 key shares and \
                AES-128-GCM first, or an OpenSSL client's X25519 and AES-256-GCM first, or \
                P-256 alone; SNI picks the ECDSA P-256 or the RSA-2048 certificate), \
                then ab over https (GET c=8: OpenSSL 3.0, X25519, AES-256-GCM, the request \
                in a write of its own after the handshake), answered 200 by the proxy \
                itself; CPU/req is the proxy's CPU per connection.",
        backend: BackendKind::None,
        route: Route::Respond,
        path: "/",
        peers: vec![Peer::Weir, Peer::Nginx, Peer::HaproxyHttp],
        loads,
        expect_status: 200,
        check_metrics: false,
        tls: true,
    }
}

/// The connections of a `tls-rate` load: `tls-proxy`'s wrk c=32 row, at a fixed rate.
pub const TLS_RATE_CONNS: u32 = 32;

/// `tls-rate`: `tls-proxy`'s keep-alive TLS row at fixed request rates, so that every
/// proxy serves the same load and CPU per request compares like for like (under wrk's
/// closed loop the proxy that finishes sooner sleeps more, and pays for each wake-up).
fn tls_rate(quick: bool) -> Scenario {
    let rates: &[u32] = if quick {
        &[10_000]
    } else {
        &[10_000, 20_000, 30_000]
    };
    Scenario {
        name: "tls-rate",
        seeds: "issue 13 (keep-alive TLS at equal load)",
        about: "The open-loop generator over keep-alive TLS 1.3 (rustls, a session per \
                connection, 32 connections) at fixed rates, in front of nginx returning 615 \
                bytes; latency from each request's intended send time.",
        backend: BackendKind::Nginx615,
        route: Route::Proxy,
        path: "/",
        peers: vec![Peer::Weir, Peer::Nginx, Peer::HaproxyHttp],
        loads: rates
            .iter()
            .map(|&rate| Load::Rate {
                rate,
                conns: TLS_RATE_CONNS,
            })
            .collect(),
        expect_status: 200,
        check_metrics: false,
        tls: true,
    }
}

/// The issue 14 h2c rows: h2load -c 32 -m 16 with prior knowledge, Weir against nginx and
/// HAProxy, each speaking h2c to the client; `Grpc` calls a gRPC backend over h2c too.
fn h2c_scenario(name: Name) -> Scenario {
    let (conns, streams) = (32, 16);
    let peers = vec![Peer::Weir, Peer::Nginx, Peer::HaproxyHttp];
    if name == Name::Grpc {
        return Scenario {
            name: "grpc",
            seeds: "issue 14 (gRPC unary)",
            about: "Unary gRPC calls over h2c: h2load -c 32 -m 16 posting one 21-byte gRPC \
                    message (content-type: application/grpc, te: trailers) through the proxy \
                    to an h2c gRPC-ish backend that echoes it with grpc-status 0 trailers.",
            backend: BackendKind::GrpcH2c,
            route: Route::Grpc,
            path: crate::h2load::GRPC_PATH,
            peers,
            loads: vec![Load::GrpcUnary { conns, streams }],
            expect_status: 200,
            check_metrics: false,
            tls: false,
        };
    }
    Scenario {
        name: "h2c",
        seeds: "issue 14 (h2c)",
        about: "h2load -c 32 -m 16 over cleartext HTTP/2 with prior knowledge to one proxy \
                worker, 615 B from the nginx backend over HTTP/1.1 keep-alive.",
        backend: BackendKind::Nginx615,
        route: Route::H2c,
        path: "/",
        peers,
        loads: vec![Load::H2load { conns, streams }],
        expect_status: 200,
        check_metrics: false,
        tls: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_names_its_seed_and_has_weir() {
        for n in Name::EVERY {
            for quick in [false, true] {
                let s = build(n, quick);
                assert!(!s.seeds.is_empty());
                assert!(s.peers.contains(&Peer::Weir), "{}", s.name);
                assert!(!s.loads.is_empty());
            }
        }
    }

    #[test]
    fn quick_trims_loads() {
        let full = build(Name::Proxy1Core, false);
        let quick = build(Name::Proxy1Core, true);
        assert_eq!(full.loads.len(), 5);
        assert!(quick.loads.len() < full.loads.len());
        // GET and POST at the seed's 100, 1,000 and 10,000 connections.
        let seed_002 = build(Name::DefaultBackend, false);
        assert_eq!(seed_002.loads.len(), 6);
        assert_eq!(seed_002.loads.iter().map(Load::conns).max(), Some(10_000));
    }

    #[test]
    fn only_tls_proxy_runs_over_tls_and_has_an_h2_row() {
        for n in Name::EVERY {
            let s = build(n, true);
            let tls = [
                Name::TlsProxy,
                Name::TlsHandshake,
                Name::TlsBulk,
                Name::TlsRate,
            ]
            .contains(&n);
            assert_eq!(s.tls, tls, "{}", s.name);
        }
        let s = build(Name::TlsProxy, true);
        assert!(s.peers.contains(&Peer::Nginx));
        assert!(s.loads.contains(&Load::H2load {
            conns: 32,
            streams: 16
        }));
    }

    #[test]
    fn tls_rate_holds_tls_proxys_connections_at_fixed_rates() {
        let s = build(Name::TlsRate, false);
        assert!(s.tls);
        assert_eq!(s.peers, vec![Peer::Weir, Peer::Nginx, Peer::HaproxyHttp]);
        let rates: Vec<u32> = s
            .loads
            .iter()
            .map(|l| match *l {
                Load::Rate { rate, conns } => {
                    assert_eq!(conns, 32);
                    rate
                }
                other => panic!("not a fixed rate: {other:?}"),
            })
            .collect();
        assert_eq!(rates, vec![10_000, 20_000, 30_000]);
        assert_eq!(build(Name::TlsRate, true).loads.len(), 1);
    }
}
