//! Crash consistency: the sandbox daemon is SIGKILLed at random points while several clients
//! make random mutations, then restarted; after every restart the state it serves and the
//! cgroup files it keeps must be those of exactly the acknowledged mutations, plus or minus the
//! ones in flight when it died (each wholly present or wholly absent).
//!
//! The choices (operations, sizes, when to kill) come from a seeded generator; the seed is
//! printed, and `CPUPOOL_CRASH_SEED=N` repeats them (where the kill lands still depends on
//! scheduling). At least 1,000 mutations and 50 kills; and a second run that compacts the state
//! journal after every mutation (`CPUPOOL_COMPACT_EVERY=1`), so that kills land inside
//! compactions, and counts those that did.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Daemon, Varlink};
use serde_json::{json, Value};

/// 2x8x2:2 (CPU c and c+16 are siblings): reserved 0,16; exclusive `ex` 14 CPUs handed out as
/// threads; shared `web` 16 CPUs (16,000 millicpus).
const CONFIG: &str = "[pools.sys]\nkind = \"reserved\"\ncpus = \"0,16\"\n\
    [pools.ex]\nkind = \"exclusive\"\ncpus = \"1-7,17-23\"\nsmt = \"threads\"\n\
    [pools.web]\nkind = \"shared\"\ncpus = \"8-15,24-31\"\n";
const SHAPE: &str = "2x8x2:2";
const CLIENTS: usize = 4;
const MIN_MUTATIONS: usize = 1000;
const MIN_KILLS: usize = 50;

/// splitmix64: small, seedable, good enough to choose test steps.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Held {
    pool: String,
    target: String,
}

#[derive(Debug, Clone)]
enum Op {
    Assign { id: String, pool: String, params: Value },
    Release { id: String },
}

/// What one client saw in one round.
#[derive(Default)]
struct Log {
    /// Acknowledged operations in order, with the reply.
    acked: Vec<(Op, Result<Value, String>)>,
    /// The operation sent when the daemon died, if any.
    in_flight: Option<Op>,
}

fn target_of(id: &str) -> String {
    format!("cgroup:crash/{id}")
}

/// One client's round: random mutations until the daemon dies.
fn client(
    varlink: PathBuf,
    cgroups: PathBuf,
    seed: u64,
    round: usize,
    c: usize,
    mut held: Vec<String>,
) -> Log {
    let mut rng = Rng::new(seed ^ ((round as u64) << 32) ^ (c as u64 + 1).wrapping_mul(0x1000_0001));
    let mut log = Log::default();
    let Ok(mut v) = Varlink::try_connect(&varlink) else { return log };
    for k in 0.. {
        let op = if !held.is_empty() && rng.below(100) < 45 {
            let i = rng.below(held.len() as u64) as usize;
            Op::Release { id: held[i].clone() }
        } else {
            let id = format!("r{round}c{c}n{k}");
            fs::create_dir_all(cgroups.join("crash").join(&id)).unwrap();
            let (pool, size) = if rng.below(2) == 0 {
                ("ex", json!({ "cpus": 1 + rng.below(2) }))
            } else {
                ("web", json!({ "millicpus": 1 + rng.below(1500) }))
            };
            let mut params = json!({ "pool": pool, "target": target_of(&id), "id": id });
            params.as_object_mut().unwrap().extend(size.as_object().unwrap().clone());
            Op::Assign { id, pool: pool.to_owned(), params }
        };
        let reply = match &op {
            Op::Assign { params, .. } => v.try_call("Assign", params.clone()),
            Op::Release { id } => v.try_call("Release", json!({ "id": id })),
        };
        match reply {
            Err(_) => {
                log.in_flight = Some(op);
                return log;
            }
            Ok(r) => {
                match (&op, &r) {
                    (Op::Assign { id, .. }, Ok(_)) => held.push(id.clone()),
                    (Op::Release { id }, Ok(_)) => held.retain(|h| h != id),
                    _ => {}
                }
                log.acked.push((op, r.map_err(|(name, _)| name)));
            }
        }
    }
    log
}

/// Everything the daemon serves and keeps, checked against `model` after a restart. In-flight
/// operations of the last round are resolved from what the daemon has: each must be wholly
/// there or wholly absent.
fn check(d: &Daemon, model: &mut BTreeMap<String, Held>, uncertain: &[Op], round: usize, seed: u64) {
    let ctx = format!("after restart {round} (CPUPOOL_CRASH_SEED={seed})");
    // No CPU owned twice, in the state and in the cgroup files; every target's file matches.
    let live: BTreeMap<String, Held> = d
        .served_assignments("ex", &ctx)
        .iter()
        .map(|a| {
            let held = Held {
                pool: a["pool"].as_str().unwrap().to_owned(),
                target: a["target"].as_str().unwrap().to_owned(),
            };
            (a["id"].as_str().unwrap().to_owned(), held)
        })
        .collect();
    for op in uncertain {
        match op {
            Op::Assign { id, pool, .. } => {
                if let Some(held) = live.get(id) {
                    assert_eq!(held, &Held { pool: pool.clone(), target: target_of(id) }, "{ctx}: {id}");
                    model.insert(id.clone(), held.clone());
                }
            }
            Op::Release { id } => {
                if !live.contains_key(id) {
                    model.remove(id);
                }
            }
        }
    }
    let lost: Vec<_> = model.keys().filter(|id| !live.contains_key(*id)).collect();
    let extra: Vec<_> = live.keys().filter(|id| !model.contains_key(*id)).collect();
    assert!(
        lost.is_empty() && extra.is_empty(),
        "{ctx}: acknowledged but lost {lost:?}; never acknowledged {extra:?}"
    );
    assert_eq!(&live, model, "{ctx}");

    // Targets without an assignment hold no CPUs: nothing unacknowledged was half applied.
    for entry in fs::read_dir(d.sb.join("cgroup/crash")).into_iter().flatten() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if !live.contains_key(&name) {
            let file = d.cgroup(&format!("crash/{name}/cpuset.cpus")).unwrap_or_default();
            assert_eq!(file, "", "{ctx}: target of {name}, which has no assignment, holds CPUs");
        }
    }
    // Pool slices as the pools say; the reserved pool's slices are the host ones.
    let mut v = Varlink::connect(&d.varlink);
    for p in v.call("ListPools", json!({})).unwrap()["pools"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let slice = match p["kind"].as_str() {
            Some("reserved") => "system.slice".to_owned(),
            _ => format!("cpupool.slice/cpupool-{name}.slice"),
        };
        let file = d.cgroup(&format!("{slice}/cpuset.cpus"));
        assert_eq!(file.as_deref(), p["cpus"].as_str(), "{ctx}: slice of pool {name}");
    }
}

#[test]
fn sigkill_at_random_points_loses_and_half_applies_nothing() {
    let kills = kill_at_random(MIN_MUTATIONS, MIN_KILLS, &[]);
    println!("{kills}");
}

/// The same with a compaction after every mutation (a new snapshot and a new journal), so that
/// most kills land inside one: found out after each kill from what a compaction leaves
/// half-done (a temporary file, or a new snapshot beside the journal it replaces).
#[test]
fn sigkill_during_compaction_loses_and_half_applies_nothing() {
    let kills = kill_at_random(MIN_MUTATIONS / 3, MIN_KILLS / 2, &[("CPUPOOL_COMPACT_EVERY", "1")]);
    println!("{kills}");
    assert!(kills.in_compaction > 0, "no kill landed inside a compaction: {kills}");
}

/// What the kills of a run hit.
#[derive(Default)]
struct Kills {
    total: usize,
    in_compaction: usize,
}

impl std::fmt::Display for Kills {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} kills, {} of them inside a compaction", self.total, self.in_compaction)
    }
}

/// Whether the state directory shows a compaction cut short: a temporary file of the snapshot
/// or the journal, or a snapshot that already includes the journal's last record (written, the
/// journal not yet switched).
fn compaction_cut_short(state: &std::path::Path) -> bool {
    let tmp = ["state.json.tmp", "state.json.prev.tmp", "state.journal.tmp", "state.journal.prev.tmp"];
    if tmp.iter().any(|t| state.join(t).exists()) {
        return true;
    }
    let snapshot = fs::read_to_string(state.join("state.json")).unwrap_or_default();
    let snapshot_seq: Option<u64> = snapshot.lines().next().and_then(|h| h.split(' ').nth(2)?.parse().ok());
    let journal = fs::read_to_string(state.join("state.journal")).unwrap_or_default();
    let last: Option<u64> =
        journal.lines().rev().find_map(|l| l.strip_prefix("r ")?.split(' ').next()?.parse().ok());
    matches!((snapshot_seq, last), (Some(s), Some(l)) if l <= s)
}

/// Kills the daemon at random points until at least `min_mutations` were sent and `min_kills`
/// made, checking everything after each restart.
fn kill_at_random(min_mutations: usize, min_kills: usize, env: &[(&str, &str)]) -> Kills {
    let seed = std::env::var("CPUPOOL_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    println!("crash consistency seed: {seed} (CPUPOOL_CRASH_SEED={seed} repeats the choices)");
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(seed);
    let mut model: BTreeMap<String, Held> = BTreeMap::new();
    let mut uncertain: Vec<Op> = Vec::new();
    let (mut mutations, mut kills, mut acked_ok) = (0, 0, 0);
    let mut in_compaction = 0;
    let mut round = 0;
    let args = ["--bus", "none", "--log-level", "warn"];
    while mutations < min_mutations || kills < min_kills {
        assert!(round < 400, "only {mutations} mutations in {round} rounds");
        let d = Daemon::start_shaped_env(dir.path(), SHAPE, Some(CONFIG), &args, env);
        check(&d, &mut model, &uncertain, round, seed);
        uncertain.clear();

        let threads: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let held: Vec<String> = model.keys().filter(|id| id.ends_with_client(c)).cloned().collect();
                let (varlink, cgroups) = (d.varlink.clone(), d.sb.join("cgroup"));
                std::thread::spawn(move || client(varlink, cgroups, seed, round, c, held))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(10 + rng.below(150)));
        let state = d.sb.join("state");
        d.kill();
        kills += 1;
        in_compaction += usize::from(compaction_cut_short(&state));
        for t in threads {
            let log = t.join().unwrap();
            mutations += log.acked.len() + usize::from(log.in_flight.is_some());
            for (op, reply) in log.acked {
                match (op, reply) {
                    (Op::Assign { id, pool, .. }, Ok(_)) => {
                        acked_ok += 1;
                        let target = target_of(&id);
                        model.insert(id, Held { pool, target });
                    }
                    (Op::Release { id }, Ok(_)) => {
                        acked_ok += 1;
                        model.remove(&id);
                    }
                    // A refusal (the pool is full) changes nothing.
                    (_, Err(name)) => assert!(
                        name.ends_with("InsufficientCapacity"),
                        "unexpected error {name} (CPUPOOL_CRASH_SEED={seed})"
                    ),
                }
            }
            uncertain.extend(log.in_flight);
        }
        round += 1;
    }
    let d = Daemon::start_shaped_env(dir.path(), SHAPE, Some(CONFIG), &args, env);
    check(&d, &mut model, &uncertain, round, seed);
    println!(
        "{mutations} mutations ({acked_ok} acknowledged as done) from {CLIENTS} clients, {kills} SIGKILLs, \
         {} assignments at the end: consistent after every restart",
        model.len()
    );
    d.stop();
    Kills { total: kills, in_compaction }
}

/// Ids are `r{round}c{client}n{k}`: which client made one.
trait ClientId {
    fn ends_with_client(&self, c: usize) -> bool;
}

impl ClientId for String {
    fn ends_with_client(&self, c: usize) -> bool {
        self.split_once('c')
            .and_then(|(_, rest)| rest.split_once('n'))
            .is_some_and(|(n, _)| n == c.to_string())
    }
}

/// The daemon's own journal after a crash: a torn last record is ignored (and said so), a
/// damaged record with good ones after it stops the start naming the file, record and offset,
/// and `--restore-previous-state` keeps the records before it.
/// Starts the daemon on the sandbox in `dir`, which must refuse to start (exit status 1):
/// its stderr.
fn refused_start(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cpupoold"))
        .arg("--sandbox")
        .arg(dir.join("sb"))
        .args(["--topology", SHAPE])
        .args(args)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Assigns 100 millicpus of `web` to a cgroup of each id's own.
fn assign(d: &Daemon, ids: &[&str]) {
    let mut v = Varlink::connect(&d.varlink);
    for id in ids {
        fs::create_dir_all(d.sb.join("cgroup/crash").join(id)).unwrap();
        let params = json!({ "pool": "web", "target": target_of(id), "millicpus": 100, "id": id });
        v.call("Assign", params).unwrap();
    }
}

/// The ids of the assignments `d` serves, checked against the cgroup files.
fn ids(d: &Daemon) -> Vec<String> {
    d.served_assignments("ex", "ids").iter().map(|a| a["id"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn a_torn_journal_tail_is_ignored_and_a_damaged_record_refused_until_restored() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--bus", "none", "--log-level", "warn"];
    let d = Daemon::start_shaped(dir.path(), SHAPE, Some(CONFIG), &args);
    assign(&d, &["a", "b", "c"]);
    let journal = d.sb.join("state/state.journal");
    d.kill();

    // A last record cut short, as a crash during its write leaves it.
    let mut bytes = fs::read(&journal).unwrap();
    let good = bytes.len();
    bytes.extend_from_slice(b"r 4 250 0123abcd\n{\"upsert\":[{\"id\":\"d\"");
    fs::write(&journal, &bytes).unwrap();
    let d = Daemon::start_shaped(dir.path(), SHAPE, Some(CONFIG), &args);
    assert_eq!(ids(&d), ["a", "b", "c"]);
    let torn = format!(
        "ignoring the torn end of `{}`: {} bytes from byte {good}",
        journal.display(),
        bytes.len() - good
    );
    assert!(d.logs().contains(&torn), "{}", d.logs());
    assign(&d, &["d", "e", "f"]);
    d.kill();

    // A flipped byte in the first of the three records since the start's compaction.
    let mut bytes = fs::read(&journal).unwrap();
    let text = String::from_utf8(bytes.clone()).unwrap();
    let first = text.find("\nr ").map(|i| i + 1).unwrap();
    bytes[first + 30] ^= 1;
    fs::write(&journal, &bytes).unwrap();
    let err = refused_start(dir.path(), &args);
    let seq = text[first + 2..].split(' ').next().unwrap();
    assert!(
        err.contains(&format!("`{}` is damaged at byte {first} (record {seq})", journal.display())),
        "{err}"
    );
    assert!(err.contains("--restore-previous-state"), "{err}");
    assert_eq!(fs::read(&journal).unwrap(), bytes, "the damaged journal is left alone");

    let d =
        Daemon::start_shaped(dir.path(), SHAPE, Some(CONFIG), &["--restore-previous-state", "--bus", "none"]);
    assert_eq!(ids(&d), ["a", "b", "c"], "the records before the damaged one, and none after");
    assert_eq!(fs::read(d.sb.join("state/state.journal.corrupt")).unwrap(), bytes);
    d.stop();
}

/// A second daemon started on a running one's state directory exits before it reads or
/// compacts anything there: the first keeps its journal and goes on acknowledging changes.
#[test]
fn a_second_daemon_on_the_same_state_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--bus", "none"];
    let d = Daemon::start_shaped(dir.path(), SHAPE, Some(CONFIG), &args);
    assign(&d, &["a"]);
    let state = d.sb.join("state");
    let before: Vec<(String, Vec<u8>)> =
        ["state.json", "state.journal", "state.json.prev", "state.journal.prev"]
            .iter()
            .map(|f| (f.to_string(), fs::read(state.join(f)).unwrap_or_default()))
            .collect();
    let err = refused_start(dir.path(), &args);
    assert!(err.contains(&format!("{}", state.join("state.lock").display())), "{err}");
    assert!(err.contains("only one cpupoold may use a state directory"), "{err}");
    for (name, bytes) in &before {
        assert_eq!(&fs::read(state.join(name)).unwrap_or_default(), bytes, "{name} was touched");
    }
    assign(&d, &["b"]);
    assert_eq!(ids(&d), ["a", "b"]);
}
