//! Load: 64 clients, half over varlink and half over D-Bus, making mixed calls (assign and
//! release in a shared and an exclusive pool, list pools, list assignments, read back their
//! own assignments) for a fixed time. Afterwards the daemon must hold exactly the assignments
//! the clients were told they hold (none lost, none duplicated), no exclusive CPU twice, and
//! the cgroup files must match. The daemon's RSS (`VmRSS`) at the start and at the end is
//! printed, not asserted.
//!
//! `cargo test --test load` runs 5 seconds; the full minute is
//! `cargo test --release --test load -- --ignored --nocapture` (or set CPUPOOL_LOAD_SECS).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{Daemon, PrivateBus, Varlink};
use serde_json::{json, Value};

const CONFIG: &str = "[pools.sys]\nkind = \"reserved\"\ncpus = \"0,16\"\n\
    [pools.ex]\nkind = \"exclusive\"\ncpus = \"1-7,17-23\"\nsmt = \"threads\"\n\
    [pools.web]\nkind = \"shared\"\ncpus = \"8-15,24-31\"\n";
const CLIENTS: usize = 64;

/// A client's transport: varlink or D-Bus, with the same calls.
enum Client {
    Varlink(Varlink),
    DBus(tokio::runtime::Runtime, zbus::Connection),
}

impl Client {
    /// `Ok(())` or the error's short name.
    fn call(&mut self, method: &str, p: &Value) -> Result<(), String> {
        match self {
            Client::Varlink(v) => v
                .call(method, p.clone())
                .map(|_| ())
                .map_err(|(name, _)| name.rsplit('.').next().unwrap_or_default().to_owned()),
            Client::DBus(rt, conn) => {
                let s = |k: &str| p[k].as_str().unwrap_or("").to_owned();
                let n = |k: &str| p[k].as_u64().unwrap_or(0);
                let m = |name: &'static str| (Some(DEST), PATH, Some(DEST), name);
                let reply: zbus::Result<zbus::Message> = rt.block_on(async {
                    let (d, o, i, name) = match method {
                        "Assign" => m("Assign"),
                        "Release" => m("Release"),
                        "GetAssignment" => m("GetAssignment"),
                        "ListAssignments" => m("ListAssignments"),
                        _ => m("ListPools"),
                    };
                    match name {
                        "Assign" => {
                            let body = (s("pool"), s("target"), n("cpus") as u32, n("millicpus"), s("id"));
                            conn.call_method(d, o, i, name, &body).await
                        }
                        "Release" | "GetAssignment" => conn.call_method(d, o, i, name, &(s("id"),)).await,
                        "ListAssignments" => conn.call_method(d, o, i, name, &("",)).await,
                        _ => conn.call_method(d, o, i, name, &()).await,
                    }
                });
                match reply {
                    Ok(_) => Ok(()),
                    Err(zbus::Error::MethodError(name, _, _)) => {
                        Err(name.rsplit('.').next().unwrap_or_default().to_owned())
                    }
                    Err(e) => panic!("D-Bus {method}: {e}"),
                }
            }
        }
    }
}

const DEST: &str = "org.cpupool.Manager1";
const PATH: &str = "/org/cpupool/Manager1";

/// One client's calls until `deadline`: the ids it holds at the end and the number of calls.
fn client(c: usize, mut t: Client, cgroups: PathBuf, deadline: Instant) -> (Vec<(String, String)>, usize) {
    let mut held: Vec<(String, String)> = Vec::new();
    let mut calls = 0;
    let mut x = c as u64 * 7919 + 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut k = 0;
    while Instant::now() < deadline {
        calls += 1;
        match next() % 10 {
            r @ 0..=4 => {
                k += 1;
                let id = format!("c{c}-{k}");
                fs::create_dir_all(cgroups.join("load").join(&id)).unwrap();
                let target = format!("cgroup:load/{id}");
                let (pool, p) = if r == 4 {
                    ("ex", json!({ "pool": "ex", "target": target, "cpus": 1, "id": id }))
                } else {
                    (
                        "web",
                        json!({ "pool": "web", "target": target, "millicpus": 1 + next() % 40, "id": id }),
                    )
                };
                match t.call("Assign", &p) {
                    Ok(()) => held.push((id, pool.to_owned())),
                    Err(e) => assert_eq!(e, "InsufficientCapacity", "client {c}: Assign {p}"),
                }
            }
            5 | 6 if !held.is_empty() => {
                let (id, _) = held.swap_remove((next() % held.len() as u64) as usize);
                t.call("Release", &json!({ "id": id }))
                    .unwrap_or_else(|e| panic!("client {c}: Release {id}: {e}"));
            }
            7 if !held.is_empty() => {
                let (id, _) = &held[(next() % held.len() as u64) as usize];
                t.call("GetAssignment", &json!({ "id": id }))
                    .unwrap_or_else(|e| panic!("client {c}: {id} lost: {e}"));
            }
            8 => t.call("ListAssignments", &json!({})).unwrap(),
            _ => t.call("ListPools", &json!({})).unwrap(),
        }
    }
    (held, calls)
}

fn run_load(secs: u64) {
    let dir = tempfile::tempdir().unwrap();
    let bus = PrivateBus::start(dir.path());
    let d = Daemon::start_shaped(
        dir.path(),
        "2x8x2:2",
        Some(CONFIG),
        &["--bus", &bus.address, "--log-level", "warn"],
    );
    let rss_start = d.rss_kib();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let threads: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (address, varlink, cgroups) = (bus.address.clone(), d.varlink.clone(), d.sb.join("cgroup"));
            std::thread::spawn(move || {
                let t = if c % 2 == 0 {
                    Client::Varlink(Varlink::connect(&varlink))
                } else {
                    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                    let conn = rt.block_on(async {
                        zbus::connection::Builder::address(address.as_str()).unwrap().build().await.unwrap()
                    });
                    Client::DBus(rt, conn)
                };
                client(c, t, cgroups, deadline)
            })
        })
        .collect();
    let mut model: BTreeMap<String, String> = BTreeMap::new();
    let mut calls = 0;
    for t in threads {
        let (held, n) = t.join().unwrap();
        calls += n;
        for (id, pool) in held {
            assert!(model.insert(id.clone(), pool).is_none(), "{id} held twice");
        }
    }
    let rss_end = d.rss_kib();

    let live: BTreeMap<String, String> = d
        .served_assignments("ex", "after the load")
        .iter()
        .map(|a| (a["id"].as_str().unwrap().to_owned(), a["pool"].as_str().unwrap().to_owned()))
        .collect();
    let lost: Vec<_> = model.keys().filter(|id| !live.contains_key(*id)).collect();
    let extra: Vec<_> = live.keys().filter(|id| !model.contains_key(*id)).collect();
    assert!(lost.is_empty() && extra.is_empty(), "lost {lost:?}; never acknowledged or released {extra:?}");
    println!(
        "load: {CLIENTS} clients (32 varlink, 32 D-Bus), {secs} s, {calls} calls ({:.0}/s), {} assignments held at the end, none lost or duplicated; daemon VmRSS {} KiB at the start, {} KiB at the end",
        calls as f64 / secs as f64,
        live.len(),
        rss_start,
        rss_end
    );
    d.stop();
}

#[test]
fn sixty_four_clients_for_five_seconds() {
    let secs = std::env::var("CPUPOOL_LOAD_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(5);
    run_load(secs);
}

#[test]
#[ignore = "a minute long: cargo test --release --test load -- --ignored --nocapture"]
fn sixty_four_clients_for_a_minute() {
    run_load(60);
}
