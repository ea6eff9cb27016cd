//! One owner per claim, against a sandbox: the engine's prepare and unprepare under
//! concurrent callers, the CDI spec that follows from the state, and the records of an
//! earlier release taken in at start. Claim uids are random v4 UUIDs, digit-first ones among
//! them, as an API server makes them.

use std::path::PathBuf;

use test_support::apiserver;

use super::super::tests::{rt, Fixture};
use super::*;
use crate::core::dra::names::assignment_name;
use crate::core::state::{AssignSpec, AssignmentId, PreparedDevice, Size, Target};
use crate::engine::Handle;

const DRIVER: &str = "dra.cpupool.io";

fn uid(n: usize) -> String {
    if n.is_multiple_of(2) {
        apiserver::uid_digit_first()
    } else {
        apiserver::uid_letter_first()
    }
}

/// A prepare of claim `uid`: `n` devices of two CPUs (a core) of pool `dp` each.
fn prepare(uid: &str, n: usize) -> PrepareClaim {
    let ids: Vec<AssignmentId> = (0..n)
        .map(|i| AssignmentId::new(&assignment_name(uid, i)).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let specs = ids
        .iter()
        .map(|id| AssignSpec {
            reclaim: false,
            ..AssignSpec::new("dp", Target::Kubelet(id.to_string()), Size::Cpus(2), Some(id.clone()))
        })
        .collect();
    let claim = PreparedClaim {
        uid: uid.to_owned(),
        namespace: apiserver::label("team"),
        name: apiserver::subdomain("claim"),
        assignments: ids,
        pods: vec![apiserver::uid()],
        devices: vec![PreparedDevice {
            request_names: vec!["cpus".into()],
            pool_name: "node-a".into(),
            device_name: "dp-numa0".into(),
            cdi_device_ids: vec![cdi::device_id(DRIVER, uid)],
        }],
    };
    PrepareClaim { claim, specs }
}

/// A prepare of claim `uid`: one device of half a CPU of the shared pool `web`.
fn prepare_shared(uid: &str) -> PrepareClaim {
    let mut p = prepare(uid, 1);
    for spec in &mut p.specs {
        spec.pool = "web".parse().unwrap_or_else(|e| panic!("{e}"));
        spec.size = Size::Millicpus(500);
    }
    p.claim.devices[0].device_name = "web-numa0".into();
    p
}

/// The `NAME=value`s of claim `uid`'s CDI spec as the runtime reads it.
fn spec_env(f: &Fixture, uid: &str) -> Vec<String> {
    let data = std::fs::read(spec_path(f, uid)).unwrap_or_else(|e| panic!("claim {uid}'s spec: {e}"));
    let spec: serde_json::Value = serde_json::from_slice(&data).unwrap_or_else(|e| panic!("{e}"));
    let env = spec["devices"][0]["containerEdits"]["env"].as_array().cloned().unwrap_or_default();
    env.iter().filter_map(|e| e.as_str().map(str::to_owned)).collect()
}

fn spec_path(f: &Fixture, uid: &str) -> PathBuf {
    f.settings().paths.cdi_dir.join(cdi::file_name(uid))
}

/// What is left of claim `uid`: (its assignments, recorded, a CDI spec).
fn left(f: &Fixture, h: &Handle, uid: &str) -> (usize, bool, bool) {
    let snap = h.snapshot();
    (snap.claim_assignment_ids(uid).len(), snap.claim(uid).is_some(), spec_path(f, uid).exists())
}

#[test]
fn a_claim_prepared_twice_at_once_is_booked_once_with_its_record_in_one_save() {
    let f = Fixture::new();
    let (engine, _) = f.start();
    let (h, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    for round in 0..8 {
        let uid = uid(round);
        let p = prepare(&uid, 1);
        let records = f.journal_records();
        let (a, b) =
            rt().block_on(async { tokio::join!(h.prepare_claim(p.clone()), h.prepare_claim(p.clone())) });
        let (a, b) = (a.unwrap_or_else(|e| panic!("{e}")), b.unwrap_or_else(|e| panic!("{e}")));
        assert_eq!(a.changed() as u8 + b.changed() as u8, 1, "round {round}: one of them books");
        assert_eq!(a.into_inner(), b.into_inner(), "round {round}");
        assert_eq!(left(&f, &h, &uid), (1, true, true), "round {round}");
        assert_eq!(f.journal_records(), records + 1, "round {round}: the booking and the record in one save");
        // Prepared again (the kubelet asks after its restart): the same, and nothing saved.
        let again = rt().block_on(h.prepare_claim(p.clone())).unwrap_or_else(|e| panic!("{e}"));
        assert!(!again.changed(), "round {round}");
        assert_eq!(f.journal_records(), records + 1, "round {round}");
        let gone = rt().block_on(h.unprepare_claim(&uid)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(gone.len(), 1, "round {round}");
        assert_eq!(left(&f, &h, &uid), (0, false, false), "round {round}");
    }
    drop(h);
    let _ = thread.join();
}

#[test]
fn a_prepare_racing_an_unprepare_leaves_all_of_the_claim_or_none() {
    let f = Fixture::new();
    let (engine, _) = f.start();
    let (h, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    for round in 0..16 {
        let uid = uid(round);
        let p = prepare(&uid, 2);
        let (u, r) = rt().block_on(async {
            if round.is_multiple_of(2) {
                tokio::join!(h.unprepare_claim(&uid), h.prepare_claim(p.clone()))
            } else {
                let (r, u) = tokio::join!(h.prepare_claim(p.clone()), h.unprepare_claim(&uid));
                (u, r)
            }
        });
        u.unwrap_or_else(|e| panic!("{e}"));
        r.unwrap_or_else(|e| panic!("{e}"));
        let now = left(&f, &h, &uid);
        assert!(now == (2, true, true) || now == (0, false, false), "round {round}: {now:?}");
        rt().block_on(h.unprepare_claim(&uid)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(left(&f, &h, &uid), (0, false, false), "round {round}");
    }
    drop(h);
    let _ = thread.join();
}

#[test]
fn a_cdi_spec_that_cannot_be_written_leaves_nothing_booked_or_recorded() {
    let f = Fixture::new();
    let dir = f.settings().paths.cdi_dir;
    let elsewhere = f.sb.run().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap_or_else(|e| panic!("{e}"));
    // A link in place of the CDI directory is refused (the daemon would write where it points).
    std::os::unix::fs::symlink(&elsewhere, &dir).unwrap_or_else(|e| panic!("{e}"));
    let (engine, _) = f.start();
    let (h, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    let uid = uid(0);
    let before = h.snapshot().state.clone();
    let err = rt().block_on(h.prepare_claim(prepare(&uid, 1)));
    assert!(matches!(&err, Err(EngineError::Claim(why)) if why.contains("given back")), "{err:?}");
    assert_eq!(h.snapshot().state, before, "nothing booked or recorded");
    assert_eq!(left(&f, &h, &uid).0, 0);
    drop(h);
    let _ = thread.join();
    // Nor in the files: the commit was undone durably.
    let (engine, _) = f.start();
    let (h, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(h.snapshot().state.assignments().len(), 0);
    assert_eq!(h.snapshot().claim(&uid), None);
    drop(h);
    let _ = thread.join();
}

#[test]
fn a_claims_cdi_spec_follows_from_the_state_and_is_written_again_at_start() {
    let f = Fixture::new();
    let uid = uid(0);
    let (written, claim) = {
        let (engine, _) = f.start();
        let (h, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
        let claim = rt().block_on(h.prepare_claim(prepare(&uid, 2))).unwrap_or_else(|e| panic!("{e}"));
        let written = std::fs::read(spec_path(&f, &uid)).unwrap_or_else(|e| panic!("{e}"));
        drop(h);
        let _ = thread.join();
        (written, claim.into_inner())
    };
    // What a runtime reads: the claim's CPUs, pool, assignments and uid, as the kubelet's
    // device plugin gives its containers; a digit-first uid declares 0.5.0.
    let spec: serde_json::Value = serde_json::from_slice(&written).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(spec["cdiVersion"], "0.5.0");
    assert_eq!(spec["kind"], "dra.cpupool.io/cpu");
    let env = spec["devices"][0]["containerEdits"]["env"].to_string();
    let ids = claim.assignments.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
    for want in ["CPUPOOL_CPUS=1-2,5-6", "CPUPOOL_POOL=dp,dp", "EXCLUSIVE_CPUS=1-2,5-6"] {
        assert!(env.contains(want), "{want} in {env}");
    }
    assert!(
        env.contains(&format!("CPUPOOL_ASSIGNMENT={ids}")) && env.contains(&format!("CPUPOOL_CLAIM={uid}")),
        "{env}"
    );
    std::fs::remove_file(spec_path(&f, &uid)).unwrap_or_else(|e| panic!("{e}"));
    let (engine, _) = f.start();
    let (h, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(h.snapshot().claim(&uid), Some(&claim), "the claim came back from the journal");
    assert_eq!(std::fs::read(spec_path(&f, &uid)).ok(), Some(written), "written again, the same bytes");
    drop(h);
    let _ = thread.join();
}

#[test]
fn records_of_an_earlier_release_are_taken_into_the_state_once_and_then_removed() {
    let f = Fixture::new();
    let (good, forged) = (uid(0), uid(1));
    {
        // An earlier release booked them, and wrote their records as files.
        let (engine, _) = f.start();
        let (h, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
        let specs: Vec<AssignSpec> = [&good, &forged].into_iter().flat_map(|u| prepare(u, 1).specs).collect();
        rt().block_on(h.assign_all(specs)).unwrap_or_else(|e| panic!("{e}"));
        drop(h);
        let _ = thread.join();
    }
    let records = Claims::new(&f.sb.state());
    let claim = prepare(&good, 1).claim;
    records.save(&claim).unwrap_or_else(|e| panic!("{e}"));
    let mut bad = prepare(&forged, 1).claim;
    bad.assignments = vec![AssignmentId::new("app").unwrap_or_else(|e| panic!("{e}"))];
    records.save(&bad).unwrap_or_else(|e| panic!("{e}"));
    let file = |u: &str| f.sb.state().join(crate::engine::claims::records::DIR).join(format!("{u}.json"));

    let (engine, _) = f.start();
    let (h, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(h.snapshot().claim(&good), Some(&claim));
    assert!(!file(&good).exists(), "taken into the state, the file goes");
    assert!(spec_path(&f, &good).exists(), "its CDI spec follows from the state");
    // A record naming another's assignment is not trusted: not taken, left where it is.
    assert_eq!(h.snapshot().claim(&forged), None);
    assert!(file(&forged).exists());
    drop(h);
    let _ = thread.join();
    // Once: the state holds it, with no file to take in again.
    let (engine, _) = f.start();
    let (h, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(h.snapshot().claim(&good), Some(&claim));
    drop(h);
    let _ = thread.join();
}

#[test]
fn a_shared_claims_cdi_spec_follows_its_pools_cpus_on_reload_and_at_start() {
    let f = Fixture::new();
    let (shared, exclusive) = (uid(0), uid(1));
    let config =
        |web: &str| super::super::tests::CONFIG.replace("cpus = \"3,7\"", &format!("cpus = \"{web}\""));
    {
        let (engine, _) = f.start();
        let (h, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
        rt().block_on(h.prepare_claim(prepare_shared(&shared))).unwrap_or_else(|e| panic!("{e}"));
        rt().block_on(h.prepare_claim(prepare(&exclusive, 1))).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            spec_env(&f, &shared).contains(&"CPUPOOL_CPUS=3,7".to_owned()),
            "{:?}",
            spec_env(&f, &shared)
        );
        assert!(spec_env(&f, &shared).contains(&"SHARED_CPUS=3,7".to_owned()));
        let exclusive_spec = std::fs::read(spec_path(&f, &exclusive)).unwrap_or_else(|e| panic!("{e}"));
        // The shared pool shrinks: the claim's next container reads its new CPUs.
        f.config(&config("3"));
        rt().block_on(h.reload(Ok(f.settings()))).unwrap_or_else(|e| panic!("{}", error_chain(&e)));
        assert!(spec_env(&f, &shared).contains(&"CPUPOOL_CPUS=3".to_owned()), "{:?}", spec_env(&f, &shared));
        assert!(spec_env(&f, &shared).contains(&"SHARED_CPUS=3".to_owned()));
        let unmoved = std::fs::read(spec_path(&f, &exclusive)).ok();
        assert_eq!(unmoved, Some(exclusive_spec), "an exclusive claim's CPUs did not move");
        drop(h);
        let _ = thread.join();
    }
    // Changed while the daemon was down: the start writes it again.
    f.config(&config("3,7"));
    let (engine, _) = f.start();
    let (h, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    assert!(spec_env(&f, &shared).contains(&"CPUPOOL_CPUS=3,7".to_owned()), "{:?}", spec_env(&f, &shared));
    // A spec someone else changed is written again when the kubelet prepares the claim again.
    let forged =
        cdi::spec(DRIVER, &shared, &[("CPUPOOL_CPUS".into(), "0".into())]).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(spec_path(&f, &shared), forged.to_string()).unwrap_or_else(|e| panic!("{e}"));
    let again = rt().block_on(h.prepare_claim(prepare_shared(&shared))).unwrap_or_else(|e| panic!("{e}"));
    assert!(!again.changed(), "nothing booked again");
    assert!(spec_env(&f, &shared).contains(&"CPUPOOL_CPUS=3,7".to_owned()), "{:?}", spec_env(&f, &shared));
    drop(h);
    let _ = thread.join();
}
