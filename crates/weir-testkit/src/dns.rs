//! [`DnsServer`]: a small authoritative DNS server on `127.0.0.1:<ephemeral>` (UDP) for the
//! discovery tests: A, AAAA and SRV records the test sets and changes while it runs, a TTL,
//! and a switch that stops it answering (a DNS outage: queries time out).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};

/// One SRV record of a name.
#[derive(Debug, Clone)]
pub struct Srv {
    pub priority: u16,
    pub weight: u16,
    pub port: u16,
    /// A name with A/AAAA records in this server.
    pub target: String,
}

#[derive(Default)]
struct Zone {
    /// By lower-case name without the final dot.
    records: HashMap<String, Vec<RData>>,
    ttl: u32,
}

/// The server; stopped (and its thread joined) when dropped.
pub struct DnsServer {
    pub addr: SocketAddr,
    zone: Arc<Mutex<Zone>>,
    down: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DnsServer {
    /// Starts answering on a fresh UDP port, with no records and a TTL of 1 s.
    pub fn start() -> DnsServer {
        let socket = UdpSocket::bind("127.0.0.1:0").expect("testkit: bind dns");
        socket
            .set_read_timeout(Some(Duration::from_millis(20)))
            .expect("testkit: dns read timeout");
        let addr = socket.local_addr().expect("testkit: dns addr");
        let zone = Arc::new(Mutex::new(Zone {
            ttl: 1,
            ..Zone::default()
        }));
        let (down, stop, answered) = Default::default();
        let server = Serve {
            socket,
            zone: Arc::clone(&zone),
            down: Arc::clone(&down),
            stop: Arc::clone(&stop),
            answered: Arc::clone(&answered),
        };
        let thread = std::thread::spawn(move || server.run());
        DnsServer {
            addr,
            zone,
            down,
            stop,
            answered,
            thread: Some(thread),
        }
    }

    /// The A and AAAA records of `name` become `ips` (none: the name is gone).
    pub fn set_ips(&self, name: &str, ips: &[IpAddr]) {
        let data = ips
            .iter()
            .map(|ip| match ip {
                IpAddr::V4(v4) => RData::A(A(*v4)),
                IpAddr::V6(v6) => RData::AAAA(AAAA(*v6)),
            })
            .collect();
        self.set(name, data);
    }

    /// The SRV records of `name` become `records`.
    pub fn set_srv(&self, name: &str, records: &[Srv]) {
        let data = records
            .iter()
            .map(|r| {
                let target = Name::from_ascii(format!("{}.", r.target)).expect("testkit: target");
                RData::SRV(SRV::new(r.priority, r.weight, r.port, target))
            })
            .collect();
        self.set(name, data);
    }

    /// The TTL of every answer from now on.
    pub fn set_ttl(&self, seconds: u32) {
        self.zone.lock().expect("testkit: zone").ttl = seconds;
    }

    /// `true`: queries get no answer at all (as if the server were down) until `false`.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// Queries answered so far.
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::SeqCst)
    }

    fn set(&self, name: &str, data: Vec<RData>) {
        let key = key(name);
        let mut zone = self.zone.lock().expect("testkit: zone");
        let kind = data.first().map(RData::record_type);
        let records = zone.records.entry(key).or_default();
        // Replaces the records of the kinds given (A and AAAA together), keeps the others.
        let ip = |t: RecordType| matches!(t, RecordType::A | RecordType::AAAA);
        records.retain(|r| match kind {
            Some(RecordType::SRV) => r.record_type() != RecordType::SRV,
            _ => !ip(r.record_type()),
        });
        records.extend(data);
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn key(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

struct Serve {
    socket: UdpSocket,
    zone: Arc<Mutex<Zone>>,
    down: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
}

impl Serve {
    fn run(self) {
        let mut buf = [0u8; 1500];
        while !self.stop.load(Ordering::SeqCst) {
            let Ok((len, peer)) = self.socket.recv_from(&mut buf) else {
                continue;
            };
            if self.down.load(Ordering::SeqCst) {
                continue;
            }
            let Ok(query) = Message::from_vec(&buf[..len]) else {
                continue;
            };
            if let Ok(bytes) = self.answer(&query).to_vec() {
                if self.socket.send_to(&bytes, peer).is_ok() {
                    self.answered.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    }

    /// The records of the query's name and type; NXDOMAIN for a name with none at all.
    fn answer(&self, query: &Message) -> Message {
        let mut response = Message::response(query.metadata.id, query.metadata.op_code);
        response.metadata.message_type = MessageType::Response;
        response.metadata.authoritative = true;
        response.metadata.recursion_desired = query.metadata.recursion_desired;
        let zone = self.zone.lock().expect("testkit: zone");
        for q in &query.queries {
            response.add_query(q.clone());
            let records = zone.records.get(&key(&q.name().to_ascii()));
            if records.is_none_or(|r| r.is_empty()) {
                response.metadata.response_code = ResponseCode::NXDomain;
                continue;
            }
            let wanted = records.into_iter().flatten();
            for data in wanted.filter(|d| d.record_type() == q.query_type()) {
                let record = Record::from_rdata(q.name().clone(), zone.ttl, data.clone());
                response.add_answer(record);
            }
        }
        response
    }
}
