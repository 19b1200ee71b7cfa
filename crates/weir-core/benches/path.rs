//! Cost of path normalisation per request (`router::normalize`): the fast path (an already
//! normal path, one scan and no copy) and the slow path (a path that changes, written into
//! the reused scratch buffer).
//!
//! `cargo bench -p weir-core --bench path`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use weir_config::PathNormalization;
use weir_core::router::RoutedPath;

const PATHS: [(&str, &str); 4] = [
    ("normal_short", "/index.html"),
    (
        "normal_long",
        "/api/v2/users/12345/orders/67890/items?expand=product&page=3",
    ),
    ("dot_segments", "/public/./assets/../admin/panel"),
    ("escaped", "/public/%2e%2e/caf%c3%a9/%7Euser/list?q=%2F"),
];

fn normalize(c: &mut Criterion) {
    let settings = PathNormalization::default();
    let mut routed = RoutedPath::default();
    for (name, path) in PATHS {
        c.bench_function(name, |b| {
            b.iter(|| {
                let out = routed.normalize(black_box(path.as_bytes()), &settings);
                black_box(out.map(|p| p.len()).ok());
            })
        });
    }
}

criterion_group!(benches, normalize);
criterion_main!(benches);
