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
        format!("cpupoold-state 2 0 {} {:08x}", payload.len(), crc32fast::hash(payload.as_bytes()))
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
    fs::write(store.path(), frame_with_header("cpupoold-state 3 whatever\n", b"{}")).unwrap();
    let err = load(&store).unwrap_err();
    assert!(matches!(err, StoreError::UnsupportedVersion { found: 3, supported: 2, .. }), "{err:?}");
    assert_names_file_and_prev(&err, &store);
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
    let chain = crate::engine::error_chain(&err);
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
