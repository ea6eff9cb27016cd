//! One claim, many callers: the DRA driver's claims under the kubelet's concurrency (two pods
//! sharing a claim prepare it twice at once; an unprepare lands while a prepare runs), after a
//! crash half way, with records another user could have written, and with what a peer may send
//! at the API's limits and beyond. The real `cpupoold --sandbox` (k8s feature), the
//! kubelet-shaped peer (test-support's DRA client, the real protobuf) and the fake API server
//! (`fake_apiserver/claims.rs`: no API server runs here). Claim UIDs are the kernel's random v4
//! UUIDs, digit-first ones among them, as an API server makes them.
#![cfg(feature = "k8s")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod dra_common;
mod fake_apiserver;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use cpupoold::kubernetes::dra::proto::dra as pb;
use serde_json::{json, Value};

use common::{Daemon, Varlink};
use dra_common::{cdi_path, dp, forget_record, prepare_one, record_path, recorded, register, NS};
use fake_apiserver::claims::claim;
use fake_apiserver::Fake;
use test_support::dra as peer;

const SHAPE: &str = "2x8x1:2";
const POOLS: &str = "[pools.sys]\nkind = \"reserved\"\ncpus = \"0,8\"\n\n\
    [pools.dp]\nkind = \"exclusive\"\ncpus = \"1-7,9-15\"\ndra = true\n";

/// A random v4 UUID as an API server makes one; `digit_first` chooses the kind of its first
/// character.
fn uuid(digit_first: bool) -> String {
    if digit_first {
        test_support::apiserver::uid_digit_first()
    } else {
        test_support::apiserver::uid_letter_first()
    }
}

fn start(dir: &Path, fake: &Fake) -> Daemon {
    dra_common::start_with(dir, fake, SHAPE, POOLS)
}

/// Puts a claim of `cpu` CPUs of `dp-numa0` with a fresh UUID, reserved for one pod.
fn put(fake: &Fake, name: &str, cpu: &'static str, digit_first: bool) -> pb::Claim {
    let uid = uuid(digit_first);
    let pod = uuid(!digit_first);
    fake.put_claim(claim(NS, name, &uid, &[dp("dp-numa0", cpu)], &[("pod-1", &pod)]));
    peer::claim(NS, name, &uid)
}

/// The claim's assignments, by id.
fn booked(d: &Daemon, uid: &str) -> Vec<String> {
    let mut v = Varlink::connect(&d.varlink);
    let r = v.call("ListAssignments", json!({})).unwrap();
    let prefix = format!("dra-{uid}-");
    r["assignments"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|a| a["id"].as_str().filter(|i| i.starts_with(&prefix)).map(str::to_owned))
        .collect()
}

/// What is left of claim `uid`: (assignments, a record in the daemon's state, a CDI spec).
fn left(d: &Daemon, uid: &str) -> (usize, bool, bool) {
    (booked(d, uid).len(), recorded(d, uid), cdi_path(d, uid).exists())
}

/// Two prepares of one claim at once answer the same devices and book it once; a prepare and
/// an unprepare at once leave all of it or none of it, and a prepare after that answers from
/// what is really held. Raced 30 times each, on both kinds of UUID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_claim_called_twice_at_once_is_booked_once_and_whole() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start();
    let d = start(dir.path(), &fake);
    let k = Arc::new(register(&d).await);
    for round in 0..30 {
        let c = put(&fake, &format!("twice-{round}"), "2", round % 2 == 0);
        let (a, b) = tokio::join!(prepare_one(&k, &c), prepare_one(&k, &c));
        assert_eq!(a.error, "", "round {round}: {}", d.logs());
        assert_eq!(a, b, "round {round}");
        assert_eq!(left(&d, &c.uid), (1, true, true), "round {round}");

        // Unprepare racing a prepare of the same claim.
        let (u, p) = tokio::join!(k.unprepare(vec![c.clone()]), prepare_one(&k, &c));
        assert_eq!(u.unwrap().claims[&c.uid].error, "", "round {round}");
        assert_eq!(p.error, "", "round {round}");
        let now = left(&d, &c.uid);
        assert!(now == (1, true, true) || now == (0, false, false), "round {round}: {now:?}");
        // Whatever won, a prepare now holds the CPUs it answers.
        assert_eq!(prepare_one(&k, &c).await, a, "round {round}");
        assert_eq!(left(&d, &c.uid), (1, true, true), "round {round}");
        k.unprepare(vec![c.clone()]).await.unwrap();
        assert_eq!(left(&d, &c.uid), (0, false, false), "round {round}");
    }
    d.stop();
}

/// What a crash leaves half done is put right when the driver starts, before the kubelet
/// calls: CPUs booked with no record are given back, a record whose CPUs are gone goes with
/// its spec, a missing CDI spec is written again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_half_way_is_put_right_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start();
    let d = start(dir.path(), &fake);
    let k = register(&d).await;
    let no_record = put(&fake, "no-record", "1", true);
    let no_booking = put(&fake, "no-booking", "1", false);
    let no_spec = put(&fake, "no-spec", "2", true);
    for c in [&no_record, &no_booking, &no_spec] {
        assert_eq!(prepare_one(&k, c).await.error, "", "{}", d.logs());
    }
    let spec = std::fs::read(cdi_path(&d, &no_spec.uid)).unwrap();
    // The assignment of `no-booking` released behind the driver's back (root's Release).
    let id = booked(&d, &no_booking.uid).remove(0);
    Varlink::connect(&d.varlink).call("Release", json!({"id": id})).unwrap();
    d.kill();
    // The crash: one record never written (as an earlier release's crash between booking and
    // record left it), one spec lost.
    let d0 = dir.path().join("sb");
    forget_record(&d0, &no_record.uid);
    std::fs::remove_file(d0.join(format!("run/cdi/cpupoold-{}.json", no_spec.uid))).unwrap();

    let d = start(dir.path(), &fake);
    let _k = register(&d).await;
    assert_eq!(left(&d, &no_record.uid), (0, false, false), "{}", d.logs());
    assert_eq!(left(&d, &no_booking.uid), (0, false, false), "{}", d.logs());
    assert_eq!(left(&d, &no_spec.uid), (1, true, true), "{}", d.logs());
    assert_eq!(std::fs::read(cdi_path(&d, &no_spec.uid)).unwrap(), spec);
    d.stop();
}

/// A record decides which pods get which CPUs. The records an earlier release wrote as files
/// are taken into the daemon's state at start, once, and removed; one every user may write, or
/// one that names an assignment not its claim's, is not trusted: it is not taken, and the
/// claim is not answered from it (its CPUs, booked with no record, are given back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_held_to_the_state_files_rule() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start();
    let d = start(dir.path(), &fake);
    let k = register(&d).await;
    std::fs::create_dir_all(d.sb.join("cgroup/app")).unwrap();
    let mut v = Varlink::connect(&d.varlink);
    v.call("Assign", json!({"pool": "dp", "cpus": 1, "target": "cgroup:app", "id": "app"})).unwrap();
    let (good, open, forged) =
        (put(&fake, "good", "1", true), put(&fake, "open", "1", false), put(&fake, "forged", "1", true));
    let mut answers = Vec::new();
    for c in [&good, &open, &forged] {
        let r = prepare_one(&k, c).await;
        assert_eq!(r.error, "", "{}", d.logs());
        answers.push(r);
    }
    // As an earlier release left them: the claims booked, their records files.
    let claims = recorded_claims(&d, &[&good, &open, &forged]);
    d.kill();
    let d0 = dir.path().join("sb");
    let records = cpupoold::engine::claim_records::Claims::new(&d0.join("state"));
    for (c, rec) in [&good, &open, &forged].into_iter().zip(claims) {
        forget_record(&d0, &c.uid);
        records.save(&rec).unwrap();
    }
    let rec = |c: &pb::Claim| d0.join(format!("state/dra/{}.json", c.uid));
    // World-writable (mode 0666, as a careless edit leaves it).
    std::fs::set_permissions(rec(&open), std::fs::Permissions::from_mode(0o666)).unwrap();
    // Naming the assignment `app`: not the claim's own.
    let mut bad: Value = serde_json::from_slice(&std::fs::read(rec(&forged)).unwrap()).unwrap();
    bad["assignments"] = json!(["app"]);
    std::fs::write(rec(&forged), serde_json::to_vec(&bad).unwrap()).unwrap();

    let d = start(dir.path(), &fake);
    let k = register(&d).await;
    assert_eq!(left(&d, &good.uid), (1, true, true), "{}", d.logs());
    assert!(!record_path(&d, &good.uid).exists(), "taken into the state, the file goes");
    assert_eq!(prepare_one(&k, &good).await, answers[0]);
    for c in [&open, &forged] {
        assert_eq!(left(&d, &c.uid).0, 0, "{}", d.logs());
        assert!(!recorded(&d, &c.uid));
        assert!(record_path(&d, &c.uid).exists(), "not trusted, left where it is");
    }
    let logs = d.logs();
    assert!(logs.contains("writable by every user") && logs.contains(&open.uid), "{logs}");
    assert!(logs.contains("not claim") && logs.contains("`app`"), "{logs}");
    // Once: a restart finds the claim in the state, and no file to take in.
    d.kill();
    let d = start(dir.path(), &fake);
    let k = register(&d).await;
    assert_eq!(left(&d, &good.uid), (1, true, true), "{}", d.logs());
    assert_eq!(prepare_one(&k, &good).await, answers[0]);
    // The assignment the forged record named is its own owner's still.
    assert!(dra_common::assignments(&d).iter().any(|a| a["id"] == "app"));
    d.stop();
}

/// The daemon's records of `claims`, as its state holds them.
fn recorded_claims(d: &Daemon, claims: &[&pb::Claim]) -> Vec<cpupoold::core::state::PreparedClaim> {
    let state = dra_common::saved(d);
    claims.iter().map(|c| state.claims.get(&c.uid).cloned().unwrap()).collect()
}

/// What a peer sends is bounded: more claims in one call than a kubelet sends is refused whole
/// before any is read; a claim whose record could not be read back (10,000 pods reserved, a
/// request name of 300 KiB) is refused before anything is booked; an error echoes a 1 MiB name
/// in part, never whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_peer_sends_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start();
    let d = start(dir.path(), &fake);
    let k = register(&d).await;

    let many: Vec<pb::Claim> =
        (0..257).map(|i| peer::claim(NS, &format!("c{i}"), &uuid(i % 2 == 0))).collect();
    let e = k.prepare(many.clone()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(e.message().contains("257") && e.message().contains("256"), "{e}");
    // At the cap, every claim is answered (all absent from the API server here).
    let r = k.prepare(many[..256].to_vec()).await.unwrap();
    assert_eq!(r.claims.len(), 256);
    assert!(r.claims.values().all(|c| c.error.contains("404")), "{:?}", r.claims.values().next());

    // 10,000 pods in reservedFor.
    let uid = uuid(true);
    let pods: Vec<(String, String)> = (0..10_000).map(|i| (format!("p{i}"), uuid(false))).collect();
    let pods: Vec<(&str, &str)> = pods.iter().map(|(n, u)| (n.as_str(), u.as_str())).collect();
    fake.put_claim(claim(NS, "crowded", &uid, &[dp("dp-numa0", "1")], &pods));
    let e = prepare_one(&k, &peer::claim(NS, "crowded", &uid)).await.error;
    assert!(e.contains("status.reservedFor") && e.contains("nothing was booked"), "{e}");
    assert_eq!(left(&d, &uid), (0, false, false));

    // A request name of 300 KiB.
    let uid = uuid(false);
    let mut obj = claim(NS, "long-request", &uid, &[dp("dp-numa0", "1")], &[("p", "u")]);
    obj["status"]["allocation"]["devices"]["results"][0]["request"] = json!("r".repeat(300 * 1024));
    fake.put_claim(obj);
    let e = prepare_one(&k, &peer::claim(NS, "long-request", &uid)).await.error;
    assert!(e.contains(".request") && e.len() < 4096, "{} bytes: {}", e.len(), &e[..e.len().min(300)]);
    assert_eq!(left(&d, &uid), (0, false, false));

    // A claim bigger than any API server holds (4 MiB, in an annotation) is refused as it
    // arrives: the whole of a 150 MiB one was read and decoded (332 MB).
    let uid = uuid(true);
    let mut obj = claim(NS, "huge", &uid, &[dp("dp-numa0", "1")], &[("p", "u")]);
    obj["metadata"]["annotations"] = json!({ "x": "y".repeat(4 << 20) });
    fake.put_claim(obj);
    let e = prepare_one(&k, &peer::claim(NS, "huge", &uid)).await.error;
    assert!(
        e.contains("larger than 3145728 bytes") && e.len() < 4096,
        "{} bytes: {}",
        e.len(),
        &e[..e.len().min(300)]
    );
    assert_eq!(left(&d, &uid), (0, false, false));
    // One just under the bound is read as any other claim.
    let uid = uuid(false);
    let mut obj = claim(NS, "large", &uid, &[dp("dp-numa0", "1")], &[("p", "u")]);
    obj["metadata"]["annotations"] = json!({ "x": "y".repeat(3 << 19) });
    fake.put_claim(obj);
    let r = prepare_one(&k, &peer::claim(NS, "large", &uid)).await;
    assert!(r.error.is_empty(), "{}", r.error);
    assert_eq!(left(&d, &uid), (1, true, true));

    // A 1 MiB claim name comes back cut.
    let e = prepare_one(&k, &peer::claim(NS, &"n".repeat(1 << 20), &uuid(true))).await.error;
    assert!(!e.is_empty() && e.len() < 4096, "{} bytes", e.len());
    d.stop();
}
