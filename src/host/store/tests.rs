//! The store's save, load and restore sequences against a temporary directory.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::fs;
use std::os::unix::fs::PermissionsExt;

use serde::Deserialize;

use super::format::{decode, frame};
use super::*;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct TestState {
    generation: u32,
    pools: Vec<(String, String)>,
}

/// The journal's record type for [`TestState`]: a new generation and a pool added.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Bump {
    generation: u32,
    pool: (String, String),
}

fn bump(s: &mut TestState, b: Bump) {
    s.generation = b.generation;
    s.pools.push(b.pool);
}

fn state(generation: u32) -> TestState {
    TestState { generation, pools: vec![("infra".into(), "0-1".into()), ("db".into(), "2-7".into())] }
}

fn new_store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("var/lib/cpupoold")).unwrap();
    (dir, store)
}

/// A store holding state 2 in `state.json` and state 1 in `state.json.prev`.
fn two_saves() -> (tempfile::TempDir, Store) {
    let (dir, store) = new_store();
    store.save(&state(1)).unwrap();
    store.save(&state(2)).unwrap();
    (dir, store)
}

fn load(store: &Store) -> Result<Loaded<TestState>, StoreError> {
    store.load(bump)
}

fn restore(store: &Store) -> Result<TestState, StoreError> {
    store.restore_previous(bump)
}

fn frame_with_header(header: &str, payload: &[u8]) -> Vec<u8> {
    let mut bytes = header.as_bytes().to_vec();
    bytes.extend_from_slice(payload);
    bytes
}

fn assert_names_file_and_prev(err: &StoreError, store: &Store) {
    let msg = err.to_string();
    assert!(msg.contains(&store.path().display().to_string()), "{msg}");
    assert!(msg.contains(&store.prev_path().display().to_string()), "{msg}");
    assert!(msg.contains("previous good copy exists"), "{msg}");
}

#[test]
fn fresh_start() {
    let (_dir, store) = new_store();
    assert_eq!(load(&store).unwrap(), Loaded::Fresh);
    let mode = fs::metadata(store.dir()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    assert_eq!(store.last_size(), 0);
}

#[test]
fn round_trip() {
    let (_dir, store) = new_store();
    store.save(&state(1)).unwrap();
    assert_eq!(load(&store).unwrap(), Loaded::State(state(1)));
    let bytes = fs::read(store.path()).unwrap();
    assert_eq!(store.last_size(), bytes.len() as u64);
    let text = String::from_utf8(bytes).unwrap();
    let (header, payload) = text.split_once('\n').unwrap();
    assert_eq!(
        header,
        format!(
            "cpupoold-state {FORMAT_VERSION} 0 {} {:08x}",
            payload.len(),
            crc32fast::hash(payload.as_bytes())
        )
    );
    assert!(!store.prev_path().exists(), "first save has nothing to keep");
    assert!(!store.dir().join(TMP_FILE).exists());
    let mode = fs::metadata(store.path()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn second_save_keeps_previous() {
    let (_dir, store) = two_saves();
    assert_eq!(load(&store).unwrap(), Loaded::State(state(2)));
    assert_eq!(restore(&store).unwrap(), state(1));
    let (_dir, store) = two_saves();
    store.save(&state(3)).unwrap();
    let prev = fs::read(store.prev_path()).unwrap();
    assert_eq!(decode::<TestState>(&prev).unwrap().0, state(2));
    assert!(!store.dir().join(PREV_TMP_FILE).exists());
}

#[test]
fn truncation_is_detected_and_names_prev() {
    let (_dir, store) = two_saves();
    let good = fs::read(store.path()).unwrap();
    let header_len = good.iter().position(|&b| b == b'\n').unwrap() + 1;
    for cut in [0, 1, 5, 15, 17, header_len - 1, header_len, header_len + 1, good.len() / 2, good.len() - 1] {
        fs::write(store.path(), &good[..cut]).unwrap();
        let err = load(&store).unwrap_err();
        assert!(
            matches!(err, StoreError::TruncatedHeader { .. } | StoreError::Truncated { .. }),
            "cut at {cut}: {err:?}"
        );
        assert_names_file_and_prev(&err, &store);
        assert_eq!(fs::read(store.path()).unwrap(), &good[..cut], "load must not touch the file");
    }
}

#[test]
fn flipped_byte_fails_checksum() {
    let (_dir, store) = two_saves();
    let mut bytes = fs::read(store.path()).unwrap();
    let last = bytes.len() - 3;
    bytes[last] ^= 0x20;
    fs::write(store.path(), &bytes).unwrap();
    let err = load(&store).unwrap_err();
    let StoreError::ChecksumMismatch { expected, actual, .. } = err else { panic!("{err:?}") };
    assert_ne!(expected, actual);
    assert_names_file_and_prev(&err, &store);
    assert_eq!(fs::read(store.path()).unwrap(), bytes);
}

#[test]
fn wrong_version() {
    let (_dir, store) = two_saves();
    fs::write(store.path(), frame_with_header("cpupoold-state 4 whatever\n", b"{}")).unwrap();
    let err = load(&store).unwrap_err();
    assert!(matches!(err, StoreError::UnsupportedVersion { found: 4, supported: 3, .. }), "{err:?}");
    assert_names_file_and_prev(&err, &store);
}

/// A snapshot of the format before prepared claims were state (version 2, the same header) is
/// read as it is: an installed daemon upgrades in place.
#[test]
fn version_2_is_read() {
    let (_dir, store) = new_store();
    store.save(&state(1)).unwrap();
    let text = String::from_utf8(fs::read(store.path()).unwrap()).unwrap();
    let (header, payload) = text.split_once('\n').unwrap();
    let old = header.replacen(&format!("cpupoold-state {FORMAT_VERSION} "), "cpupoold-state 2 ", 1);
    assert_ne!(old, header);
    fs::write(store.path(), format!("{old}\n{payload}")).unwrap();
    assert_eq!(load(&store).unwrap(), Loaded::State(state(1)));
}

#[test]
fn bad_headers() {
    let (_dir, store) = two_saves();
    for bytes in [
        b"{\"generation\": 1}\n".to_vec(),
        b"not a state file".to_vec(),
        frame_with_header("cpupoold-state x 2 00000000\n", b"{}"),
        frame_with_header("cpupoold-state 1 2\n", b"{}"),
        frame_with_header("cpupoold-state 1 +2 00000000\n", b"{}"),
        frame_with_header("cpupoold-state 1 2 xyz\n", b"{}"),
        vec![b'c'; 200],
    ] {
        fs::write(store.path(), &bytes).unwrap();
        let err = load(&store).unwrap_err();
        assert!(matches!(err, StoreError::BadHeader { .. }), "{bytes:?}: {err:?}");
        assert_names_file_and_prev(&err, &store);
    }
}

#[test]
fn trailing_data() {
    let (_dir, store) = two_saves();
    let mut bytes = fs::read(store.path()).unwrap();
    bytes.extend_from_slice(b"junk");
    fs::write(store.path(), &bytes).unwrap();
    let err = load(&store).unwrap_err();
    assert!(matches!(err, StoreError::TrailingData { .. }), "{err:?}");
}

#[test]
fn json_of_the_wrong_shape() {
    let (_dir, store) = two_saves();
    fs::write(store.path(), frame(0, b"{\"generation\": \"one\"}\n")).unwrap();
    let err = load(&store).unwrap_err();
    assert!(matches!(err, StoreError::Decode { .. }), "{err:?}");
    assert_names_file_and_prev(&err, &store);
    assert!(std::error::Error::source(&err).is_some());
}

#[test]
fn damaged_prev_is_reported() {
    let (_dir, store) = two_saves();
    fs::write(store.prev_path(), b"").unwrap();
    fs::write(store.path(), b"").unwrap();
    let msg = load(&store).unwrap_err().to_string();
    assert!(msg.contains("previous copy at") && msg.ends_with("is damaged"), "{msg}");
    let (_dir, store) = new_store();
    store.save(&state(1)).unwrap();
    fs::write(store.path(), b"").unwrap();
    let msg = load(&store).unwrap_err().to_string();
    assert!(msg.contains("no previous copy"), "{msg}");
}

#[test]
fn missing_current_with_prev() {
    let (_dir, store) = two_saves();
    fs::remove_file(store.path()).unwrap();
    let err = load(&store).unwrap_err();
    assert!(matches!(err, StoreError::CurrentMissing { .. }), "{err:?}");
    assert_names_file_and_prev(&err, &store);
    assert_eq!(restore(&store).unwrap(), state(1));
    assert!(!store.dir().join(CORRUPT_FILE).exists());
    assert_eq!(load(&store).unwrap(), Loaded::State(state(1)));
}

#[test]
fn restore_previous_moves_corrupt_aside() {
    let (_dir, store) = two_saves();
    let corrupt1 = b"cpupoold-state 1 9".to_vec();
    fs::write(store.path(), &corrupt1).unwrap();
    assert!(load(&store).is_err());
    assert_eq!(restore(&store).unwrap(), state(1));
    assert_eq!(load(&store).unwrap(), Loaded::State(state(1)));
    assert_eq!(fs::read(store.dir().join(CORRUPT_FILE)).unwrap(), corrupt1);
    assert_eq!(fs::read(store.path()).unwrap(), fs::read(store.prev_path()).unwrap());
    assert_eq!(store.last_size(), fs::metadata(store.path()).unwrap().len());

    let corrupt2 = b"garbage".to_vec();
    fs::write(store.path(), &corrupt2).unwrap();
    assert_eq!(restore(&store).unwrap(), state(1));
    assert_eq!(fs::read(store.dir().join(CORRUPT_FILE)).unwrap(), corrupt1);
    assert_eq!(fs::read(store.dir().join("state.json.corrupt.1")).unwrap(), corrupt2);

    // Saving after a restore works as usual.
    store.save(&state(4)).unwrap();
    assert_eq!(load(&store).unwrap(), Loaded::State(state(4)));
}

#[test]
fn restore_without_or_with_damaged_prev() {
    let (_dir, store) = new_store();
    store.save(&state(1)).unwrap();
    let err = restore(&store).unwrap_err();
    assert!(matches!(err, StoreError::NoPrevious { .. }), "{err:?}");

    let (_dir, store) = two_saves();
    fs::write(store.prev_path(), b"cpupoold-state 1 4 00000000\n{}").unwrap();
    let before = fs::read(store.path()).unwrap();
    let err = restore(&store).unwrap_err();
    assert!(matches!(err, StoreError::Truncated { .. }), "{err:?}");
    assert!(err.to_string().contains(&store.prev_path().display().to_string()));
    assert_eq!(fs::read(store.path()).unwrap(), before, "nothing moved when prev is bad");
    assert!(!store.dir().join(CORRUPT_FILE).exists());
}

// Tests run as root, which ignores mode bits, so failures are made with directories standing
// where the store wants to create files.

#[test]
fn failed_temp_create_leaves_state_alone() {
    let (_dir, store) = two_saves();
    let before = fs::read(store.path()).unwrap();
    let tmp = store.dir().join(TMP_FILE);
    fs::create_dir(&tmp).unwrap();
    let err = store.save(&state(3)).unwrap_err();
    let StoreError::Io { ref path, .. } = err else { panic!("{err:?}") };
    assert_eq!(path, &tmp);
    assert!(err.to_string().contains(&tmp.display().to_string()), "{err}");
    assert!(std::error::Error::source(&err).is_some());
    assert_eq!(fs::read(store.path()).unwrap(), before);
    assert_eq!(load(&store).unwrap(), Loaded::State(state(2)));
}

#[test]
fn failed_prev_link_leaves_state_alone_and_removes_temp() {
    let (_dir, store) = two_saves();
    let before = fs::read(store.path()).unwrap();
    let prev_before = fs::read(store.prev_path()).unwrap();
    let blocker = store.dir().join(PREV_TMP_FILE);
    fs::create_dir_all(blocker.join("x")).unwrap();
    let err = store.save(&state(3)).unwrap_err();
    let StoreError::Io { ref path, .. } = err else { panic!("{err:?}") };
    assert_eq!(path, &blocker);
    assert_eq!(fs::read(store.path()).unwrap(), before);
    assert_eq!(fs::read(store.prev_path()).unwrap(), prev_before);
    assert!(!store.dir().join(TMP_FILE).exists());
}

#[test]
fn blocked_state_path_fails_typed() {
    let (_dir, store) = new_store();
    // A non-empty directory named `state.json`: rename onto it fails.
    fs::create_dir_all(store.path().join("x")).unwrap();
    let err = store.save(&state(1)).unwrap_err();
    assert!(matches!(err, StoreError::Io { .. }), "{err:?}");
    assert!(store.path().join("x").is_dir());
    assert!(!store.dir().join(TMP_FILE).exists());
}

#[test]
fn encode_error_is_typed() {
    use std::collections::HashMap;
    let (_dir, store) = new_store();
    let bad: HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
    let err = store.save(&bad).unwrap_err();
    assert!(matches!(err, StoreError::Encode { .. }), "{err:?}");
    assert!(!store.path().exists());
}

#[test]
fn links_in_the_state_directory_are_never_followed() {
    let (dir, store) = two_saves();
    let outside = dir.path().join("outside");
    fs::write(&outside, b"precious\n").unwrap();
    // A link at the temporary name: removed, the outside file keeps its bytes.
    std::os::unix::fs::symlink(&outside, store.dir().join(TMP_FILE)).unwrap();
    store.save(&state(3)).unwrap();
    assert_eq!(fs::read(&outside).unwrap(), b"precious\n");
    assert_eq!(load(&store).unwrap(), Loaded::State(state(3)));
    // A link at `state.json`: refused when read, naming the link; restoring moves the link
    // aside and installs a real file.
    fs::remove_file(store.path()).unwrap();
    std::os::unix::fs::symlink(&outside, store.path()).unwrap();
    let err = load(&store).unwrap_err();
    let chain = crate::error_chain(&err);
    assert!(
        chain.contains(&format!("refusing to follow the symbolic link `{}`", store.path().display())),
        "{chain}"
    );
    assert_eq!(restore(&store).unwrap(), state(2));
    assert!(!fs::symlink_metadata(store.path()).unwrap().file_type().is_symlink());
    assert_eq!(fs::read(&outside).unwrap(), b"precious\n");
    // A link at `state.json.prev`: refused too.
    fs::remove_file(store.prev_path()).unwrap();
    std::os::unix::fs::symlink(&outside, store.prev_path()).unwrap();
    assert!(matches!(store.previous(bump), Err(StoreError::Io { .. })));
    let msg = load(&store).map(|_| ()).and_then(|()| restore(&store).map(drop));
    assert!(msg.is_err());
    assert_eq!(fs::read(&outside).unwrap(), b"precious\n");
}

// The journal.

fn b(generation: u32) -> Bump {
    Bump { generation, pool: (format!("p{generation}"), format!("{generation}")) }
}

/// `state(1)` with `bump(b(n))` applied for each `n` of `gens`.
fn bumped(gens: impl IntoIterator<Item = u32>) -> TestState {
    let mut s = state(1);
    for g in gens {
        bump(&mut s, b(g));
    }
    s
}

/// A store whose snapshot holds `state(1)` and whose journal holds the bumps 2..=n.
fn journaled(n: u32) -> (tempfile::TempDir, Store) {
    let (dir, store) = new_store();
    store.save(&state(1)).unwrap();
    for g in 2..=n {
        store.append(&b(g)).unwrap();
    }
    (dir, store)
}

fn journal_bytes(store: &Store) -> Vec<u8> {
    fs::read(store.journal_path()).unwrap()
}

/// Offsets of the journal's record headers.
fn record_offsets(bytes: &[u8]) -> Vec<usize> {
    journal::scan(bytes).records.iter().map(|r| r.offset as usize).collect()
}

#[test]
fn appends_replay_on_the_snapshot_in_a_new_process() {
    let (_dir, store) = journaled(4);
    let text = String::from_utf8(journal_bytes(&store)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "cpupoold-journal 1");
    assert_eq!(lines.len(), 1 + 3 * 2, "{text}");
    let payload = serde_json::to_string(&b(2)).unwrap();
    let crc = {
        let mut h = crc32fast::Hasher::new();
        h.update(format!("r 1 {} ", payload.len()).as_bytes());
        h.update(payload.as_bytes());
        h.finalize()
    };
    assert_eq!(lines[1], format!("r 1 {} {crc:08x}", payload.len()));
    assert_eq!(lines[2], payload);
    // Another process: the snapshot, then the records.
    let again = Store::open(store.dir()).unwrap();
    assert_eq!(load(&again).unwrap(), Loaded::State(bumped(2..=4)));
    // It continues the sequence.
    again.append(&b(5)).unwrap();
    assert!(String::from_utf8(journal_bytes(&again)).unwrap().contains("\nr 4 "));
    assert_eq!(load(&Store::open(store.dir()).unwrap()).unwrap(), Loaded::State(bumped(2..=5)));
}

#[test]
fn compaction_writes_the_snapshot_and_keeps_the_previous_pair() {
    let (_dir, store) = new_store();
    let store = store.with_compact_every(3);
    store.save(&state(1)).unwrap();
    for g in 2..=3 {
        store.append(&b(g)).unwrap();
        assert!(!store.compact_due());
    }
    store.append(&b(4)).unwrap();
    assert!(store.compact_due());
    let full = bumped(2..=4);
    store.save(&full).unwrap();
    assert!(!store.compact_due());
    let header = String::from_utf8(fs::read(store.path()).unwrap()).unwrap();
    assert!(
        header.starts_with(&format!("cpupoold-state {FORMAT_VERSION} 3 ")),
        "the snapshot includes record 3: {header}"
    );
    assert_eq!(journal_bytes(&store), journal::HEADER);
    assert_eq!(record_offsets(&fs::read(store.dir().join(JOURNAL_PREV_FILE)).unwrap()).len(), 3);
    assert_eq!(load(&store).unwrap(), Loaded::State(full.clone()));
    // The previous snapshot plus the previous journal give the same state.
    assert_eq!(store.previous(bump).unwrap(), full);
    store.append(&b(5)).unwrap();
    assert!(String::from_utf8(journal_bytes(&store)).unwrap().starts_with("cpupoold-journal 1\nr 4 "));
}

#[test]
fn a_crash_between_snapshot_and_journal_switch_is_harmless() {
    let (_dir, store) = journaled(3);
    // The snapshot of a compaction in place, the old journal (records 1 and 2) still there.
    let mut payload = serde_json::to_vec_pretty(&bumped(2..=3)).unwrap();
    payload.push(b'\n');
    fs::write(store.path(), frame(2, &payload)).unwrap();
    let again = Store::open(store.dir()).unwrap();
    assert_eq!(load(&again).unwrap(), Loaded::State(bumped(2..=3)));
    again.append(&b(4)).unwrap();
    assert_eq!(load(&Store::open(store.dir()).unwrap()).unwrap(), Loaded::State(bumped(2..=4)));
}

#[test]
fn a_torn_tail_is_ignored_then_cut_before_the_next_append() {
    type Tail = Box<dyn Fn(&[u8]) -> Vec<u8>>;
    let tails: Vec<(&str, Tail)> = vec![
        ("cut inside the header", Box::new(|r: &[u8]| r[..3].to_vec())),
        ("cut inside the payload", Box::new(|r: &[u8]| r[..r.len() - 5].to_vec())),
        ("whole length, never written", Box::new(|r: &[u8]| vec![0; r.len()])),
        (
            "whole length, a flipped byte",
            Box::new(|r: &[u8]| {
                let mut r = r.to_vec();
                let i = r.len() - 3;
                r[i] ^= 1;
                r
            }),
        ),
    ];
    for (what, tail) in tails {
        let (_dir, store) = journaled(3);
        let good = journal_bytes(&store);
        let mut bytes = good.clone();
        bytes.extend(tail(&journal::record(3, &serde_json::to_vec(&b(4)).unwrap())));
        fs::write(store.journal_path(), &bytes).unwrap();
        let again = Store::open(store.dir()).unwrap();
        assert_eq!(load(&again).unwrap(), Loaded::State(bumped(2..=3)), "{what}");
        assert_eq!(journal_bytes(&again), bytes, "{what}: load changes nothing");
        again.append(&b(5)).unwrap();
        let after = journal_bytes(&again);
        assert_eq!(&after[..good.len()], &good[..], "{what}");
        assert_eq!(record_offsets(&after).len(), 3, "{what}: the torn bytes are gone");
        assert_eq!(load(&Store::open(store.dir()).unwrap()).unwrap(), Loaded::State(bumped([2, 3, 5])));
    }
}

#[test]
fn damage_in_the_journal_is_refused_naming_file_record_and_offset() {
    let (_dir, store) = journaled(4);
    let good = journal_bytes(&store);
    let offsets = record_offsets(&good);
    // A flipped byte in the middle record, with a good one after it.
    let mut bytes = good.clone();
    bytes[offsets[1] + 20] ^= 1;
    fs::write(store.journal_path(), &bytes).unwrap();
    let err = load(&store).unwrap_err();
    let StoreError::JournalCorrupt { ref path, offset, seq, .. } = err else { panic!("{err:?}") };
    assert_eq!((path, offset, seq), (&store.journal_path().to_path_buf(), offsets[1] as u64, Some(2)));
    let msg = err.to_string();
    assert!(msg.contains(&format!("is damaged at byte {} (record 2)", offsets[1])), "{msg}");
    assert!(msg.contains("--restore-previous-state"), "{msg}");
    assert_eq!(journal_bytes(&store), bytes, "evidence is left alone");

    // A record that checks but does not decode.
    let mut bytes = good[..offsets[2]].to_vec();
    bytes.extend(journal::record(3, b"{\"generation\": \"four\"}"));
    fs::write(store.journal_path(), &bytes).unwrap();
    let err = load(&store).unwrap_err();
    assert!(matches!(err, StoreError::JournalDecode { seq: 3, .. }), "{err:?}");
    assert!(std::error::Error::source(&err).is_some());

    // Records missing between the snapshot and the journal, and inside the journal.
    let mut bytes = journal::HEADER.to_vec();
    bytes.extend(journal::record(2, &serde_json::to_vec(&b(3)).unwrap()));
    fs::write(store.journal_path(), &bytes).unwrap();
    let err = load(&store).unwrap_err();
    assert!(matches!(err, StoreError::JournalSequence { expected: 1, found: 2, .. }), "{err:?}");
    let mut bytes = good[..offsets[1]].to_vec();
    bytes.extend(&good[offsets[2]..]);
    fs::write(store.journal_path(), &bytes).unwrap();
    let err = load(&store).unwrap_err();
    assert!(err.to_string().contains("record 3 follows record 1"), "{err}");

    // Not a journal at all.
    fs::write(store.journal_path(), b"{}\n").unwrap();
    let err = load(&store).unwrap_err();
    assert!(matches!(err, StoreError::JournalCorrupt { offset: 0, seq: None, .. }), "{err:?}");
}

#[test]
fn restore_keeps_the_records_before_the_journals_damage() {
    let (_dir, store) = journaled(4);
    let good = journal_bytes(&store);
    let offsets = record_offsets(&good);
    let mut bytes = good.clone();
    bytes[offsets[1] + 20] ^= 1;
    fs::write(store.journal_path(), &bytes).unwrap();
    let snapshot = fs::read(store.path()).unwrap();
    assert_eq!(store.previous(bump).unwrap(), bumped([2]));
    assert_eq!(restore(&store).unwrap(), bumped([2]));
    assert_eq!(fs::read(store.dir().join(JOURNAL_CORRUPT_FILE)).unwrap(), bytes);
    assert_eq!(journal_bytes(&store), &good[..offsets[1]]);
    assert_eq!(fs::read(store.path()).unwrap(), snapshot, "the intact snapshot stays");
    assert_eq!(load(&store).unwrap(), Loaded::State(bumped([2])));
    store.append(&b(7)).unwrap();
    assert_eq!(load(&Store::open(store.dir()).unwrap()).unwrap(), Loaded::State(bumped([2, 7])));
}

#[test]
fn restore_after_a_damaged_snapshot_replays_the_previous_pair_and_the_journal() {
    let (_dir, store) = journaled(3);
    store.save(&bumped(2..=3)).unwrap();
    store.append(&b(4)).unwrap();
    let mut snapshot = fs::read(store.path()).unwrap();
    let last = snapshot.len() - 3;
    snapshot[last] ^= 0x20;
    fs::write(store.path(), &snapshot).unwrap();
    assert!(matches!(load(&store), Err(StoreError::ChecksumMismatch { .. })));
    // Nothing acknowledged is lost: state.json.prev + state.journal.prev + state.journal.
    assert_eq!(restore(&store).unwrap(), bumped(2..=4));
    assert_eq!(fs::read(store.dir().join(CORRUPT_FILE)).unwrap(), snapshot);
    assert!(String::from_utf8(fs::read(store.path()).unwrap())
        .unwrap()
        .starts_with(&format!("cpupoold-state {FORMAT_VERSION} 3 ")));
    assert_eq!(load(&store).unwrap(), Loaded::State(bumped(2..=4)));
    store.append(&b(5)).unwrap();
    assert_eq!(load(&Store::open(store.dir()).unwrap()).unwrap(), Loaded::State(bumped(2..=5)));
}

#[test]
fn a_version_1_state_file_loads_and_upgrades_in_place() {
    let (_dir, store) = new_store();
    // As the release before the journal wrote it.
    let mut payload = serde_json::to_vec_pretty(&state(1)).unwrap();
    payload.push(b'\n');
    let v1 = frame_with_header(
        &format!("cpupoold-state 1 {} {:08x}\n", payload.len(), crc32fast::hash(&payload)),
        &payload,
    );
    fs::write(store.path(), &v1).unwrap();
    assert_eq!(load(&store).unwrap(), Loaded::State(state(1)));
    store.save(&state(1)).unwrap();
    store.append(&b(2)).unwrap();
    let again = Store::open(store.dir()).unwrap();
    assert_eq!(load(&again).unwrap(), Loaded::State(bumped([2])));
    assert!(String::from_utf8(fs::read(store.path()).unwrap())
        .unwrap()
        .starts_with(&format!("cpupoold-state {FORMAT_VERSION} 0 ")));
    assert_eq!(fs::read(store.prev_path()).unwrap(), v1, "the v1 file is the previous copy");
    assert_eq!(again.previous(bump).unwrap(), bumped([2]));
}

#[test]
fn a_retracted_append_leaves_the_journal_as_it_was() {
    let (_dir, store) = journaled(2);
    let before = journal_bytes(&store);
    store.append(&b(3)).unwrap();
    store.retract().unwrap();
    assert_eq!(journal_bytes(&store), before);
    assert!(matches!(store.retract(), Err(StoreError::NothingToRetract { .. })));
    store.append(&b(4)).unwrap();
    assert_eq!(load(&Store::open(store.dir()).unwrap()).unwrap(), Loaded::State(bumped([2, 4])));
}

#[test]
fn a_journal_moved_behind_the_stores_back_is_not_written_to() {
    let (_dir, store) = journaled(2);
    let aside = store.dir().join("moved");
    fs::rename(store.journal_path(), &aside).unwrap();
    let moved = fs::read(&aside).unwrap();
    let err = store.append(&b(3)).unwrap_err();
    assert!(matches!(err, StoreError::JournalReplaced { .. }), "{err:?}");
    assert_eq!(fs::read(&aside).unwrap(), moved, "nothing written to a file no restart reads");
    assert!(store.snapshot_needed());
    store.save(&bumped(2..=3)).unwrap();
    assert!(!store.snapshot_needed());
    store.append(&b(4)).unwrap();
    assert_eq!(load(&Store::open(store.dir()).unwrap()).unwrap(), Loaded::State(bumped(2..=4)));
}

#[test]
fn one_store_at_a_time_holds_the_state_directory() {
    let dir = tempfile::tempdir().unwrap();
    let first = Store::open(dir.path()).unwrap();
    first.lock_dir().unwrap();
    first.lock_dir().unwrap();
    let second = Store::open(dir.path()).unwrap();
    let err = second.lock_dir().unwrap_err();
    assert!(matches!(&err, StoreError::Locked { path } if path.ends_with(LOCK_FILE)), "{err:?}");
    assert!(err.to_string().contains("only one cpupoold"), "{err}");
    drop(first);
    second.lock_dir().unwrap();
}

/// A FIFO or a device where the state file is expected is an error naming it, at once: before,
/// a FIFO `state.json` blocked the start in `open` forever without a log line.
#[test]
fn a_state_file_that_is_not_a_regular_file_is_refused_by_name() {
    let (_dir, store) = new_store();
    nix::unistd::mkfifo(store.path(), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let e = load(&store).err().map(|e| crate::error_chain(&e)).unwrap_or_default();
    assert!(e.contains(&store.path().display().to_string()), "{e}");
    assert!(e.contains("not a regular file but a FIFO"), "{e}");
    fs::remove_file(store.path()).unwrap();
    std::os::unix::fs::symlink("/dev/zero", store.path()).unwrap();
    let e = load(&store).err().map(|e| crate::error_chain(&e)).unwrap_or_default();
    assert!(e.contains(&store.path().display().to_string()), "{e}");
}
