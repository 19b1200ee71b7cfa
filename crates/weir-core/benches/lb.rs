//! Cost of choosing a server, per policy: the whole per-request pick as the data plane does
//! it (`WorkerUpstreams::pick`: worker-local state, availability from the shared server
//! state, the policy, the in-flight guard), over a pool of 3 and of 16 servers.
//!
//! `cargo bench -p weir-core --bench lb` (target: well under 100 ns per pick).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use weir_config::Upstream;
use weir_core::upstream::lb::consistent_hash::hash_key;
use weir_core::upstream::{RequestKey, UpstreamPlan, WorkerUpstreams};

const POLICIES: [&str; 7] = [
    "round_robin",
    "weighted_round_robin",
    "least_connections",
    "random",
    "p2c_ewma",
    "consistent_hash",
    "sticky_cookie",
];

fn upstream(lb: &str, servers: usize) -> Upstream {
    let weighted = lb != "round_robin";
    let list: Vec<String> = (0..servers)
        .map(|i| {
            let weight = if weighted { i % 3 + 1 } else { 1 };
            format!("{{ addr = \"10.0.0.{}:80\", weight = {weight} }}", i + 1)
        })
        .collect();
    let text = format!(
        "[[listeners]]\nname = \"l\"\nbind = \"127.0.0.1:0\"\n[upstreams.u]\nlb = \"{lb}\"\nservers = [{}]\n",
        list.join(", ")
    );
    let mut config = weir_config::parse_str(&text, "bench").expect("bench config");
    config.upstreams.remove(0)
}

fn picks(c: &mut Criterion) {
    let mut group = c.benchmark_group("pick");
    for servers in [3, 16] {
        for lb in POLICIES {
            let upstream = upstream(lb, servers);
            let plan = UpstreamPlan::new(&upstream, |_| None);
            let workers = WorkerUpstreams::new(1, Default::default());
            let mut i = 0u64;
            group.bench_with_input(BenchmarkId::new(lb, servers), &servers, |b, _| {
                b.iter(|| {
                    i = i.wrapping_add(1);
                    let key = RequestKey {
                        hash: Some(hash_key(&i.to_le_bytes())),
                        sticky: None,
                    };
                    let pick = workers.pick(0, &plan, &upstream, black_box(key));
                    black_box(pick.map(|p| p.server))
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, picks);
criterion_main!(benches);
