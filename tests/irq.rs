//! Interrupt affinity on the sandbox's simulated procfs (`DIR/proc/irq`, `DIR/proc/interrupts`,
//! see `sim::irq`): the tests are named `fake_procfs_*` because the kernel's part (refusing
//! a managed IRQ's write, effective affinity following a write) is the sandbox's model of it.
//! The real thing is proven in the guest (tests/vm/checks/58-irq.sh).
//!
//! Host 1x4x2 (CPU c and c+4 are siblings): reserved 0,4; `dp` 1-2,5-6 isolated; `web` 3,7.
//! The sandbox's IRQs start on every CPU (`0-7`), the managed ones (0, 41, 42) on one each.

mod common;

use std::fs;
use std::io::{IoSliceMut, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::Daemon;

const ISOLATED: &str = "[pools.sys]\nkind = \"reserved\"\ncpus = \"0,4\"\n\
    [pools.dp]\nkind = \"exclusive\"\ncpus = \"1-2,5-6\"\nisolate = true\n\
    [pools.web]\nkind = \"shared\"\ncpus = \"3,7\"\n";
const MOVABLE: [u32; 8] = [1, 8, 9, 24, 25, 26, 32, 40];
const MANAGED: [u32; 3] = [0, 41, 42];

fn irq_file(sb: &Path, irq: u32, file: &str) -> String {
    fs::read_to_string(sb.join(format!("proc/irq/{irq}/{file}")))
        .unwrap_or_else(|e| panic!("IRQ {irq} {file}: {e}"))
        .trim()
        .to_owned()
}

/// Waits (up to 30 s, for the daemon's next check or reload) until `cond` holds.
fn until(d: &Daemon, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + test_support::wait::PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "{what} did not happen:\n{}", d.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn memory(sb: &Path) -> serde_json::Value {
    let text = fs::read_to_string(sb.join("state/irq.json")).unwrap_or_else(|e| panic!("irq.json: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("irq.json: {e}: {text}"))
}

fn reload(d: &Daemon, config: &str) {
    fs::write(d.sb.join("etc/cpupoold/config.toml"), config).unwrap_or_else(|e| panic!("{e}"));
    let pid = nix::unistd::Pid::from_raw(d.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap_or_else(|e| panic!("{e}"));
}

fn all_movable_on(sb: &Path, cpus: &str) -> bool {
    MOVABLE.iter().all(|&i| irq_file(sb, i, "smp_affinity_list") == cpus)
}

#[test]
fn fake_procfs_irqs_leave_isolated_cpus_are_kept_off_and_come_back() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", Some(ISOLATED), &["--check-interval", "1"]);
    let sb = d.sb.clone();
    // Applied before READY: every movable IRQ on the reserved pool, read back.
    for irq in MOVABLE {
        assert_eq!(irq_file(&sb, irq, "smp_affinity_list"), "0,4", "IRQ {irq}:\n{}", d.logs());
        assert_eq!(irq_file(&sb, irq, "effective_affinity_list"), "0", "IRQ {irq}");
        assert_eq!(memory(&sb)["irqs"][irq.to_string()], "0-7", "IRQ {irq} remembered");
    }
    // Managed IRQs are the kernel's: left alone, reported, not remembered.
    for irq in MANAGED {
        assert_ne!(irq_file(&sb, irq, "smp_affinity_list"), "0,4", "IRQ {irq}");
        assert!(memory(&sb)["irqs"].get(irq.to_string()).is_none(), "IRQ {irq}");
    }
    assert!(d.logs().contains("placed by the kernel (managed)"), "{}", d.logs());
    assert!(d.logs().contains("41 nvme0q1"), "{}", d.logs());
    // New IRQs start on the reserved pool too.
    assert_eq!(fs::read_to_string(sb.join("proc/irq/default_smp_affinity")).unwrap_or_default().trim(), "11");

    // Someone rewrites one (irqbalance unaware of the pools, an administrator): put back.
    fs::write(sb.join("proc/irq/32/smp_affinity_list"), "0-7\n").unwrap_or_else(|e| panic!("{e}"));
    until(&d, "IRQ 32 put back on 0,4", || irq_file(&sb, 32, "smp_affinity_list") == "0,4");
    // A rewrite that avoids the isolated CPUs is left as it is, and the IRQ is no longer the
    // daemon's to restore.
    fs::write(sb.join("proc/irq/9/smp_affinity_list"), "3\n").unwrap_or_else(|e| panic!("{e}"));

    // A new IRQ appears (a device was plugged), on every CPU.
    let new = sb.join("proc/irq/50");
    fs::create_dir_all(&new).unwrap_or_else(|e| panic!("{e}"));
    for (f, v) in [("smp_affinity", "ff"), ("smp_affinity_list", "0-7"), ("effective_affinity_list", "2")] {
        fs::write(new.join(f), format!("{v}\n")).unwrap_or_else(|e| panic!("{e}"));
    }
    until(&d, "new IRQ 50 moved", || irq_file(&sb, 50, "smp_affinity_list") == "0,4");
    assert_eq!(irq_file(&sb, 50, "effective_affinity_list"), "0");
    assert_eq!(irq_file(&sb, 9, "smp_affinity_list"), "3");

    // Isolation ends: everything the daemon moved goes back to what it found.
    reload(&d, &ISOLATED.replace("isolate = true\n", ""));
    let restored = |sb: &Path| {
        MOVABLE
            .iter()
            .chain([50].iter())
            .filter(|&&i| i != 9)
            .all(|&i| irq_file(sb, i, "smp_affinity_list") == "0-7")
    };
    // One pass writes the IRQs back, then the default: waited for together (reading the
    // default as soon as the IRQs are back could land between the two writes).
    let default =
        |sb: &Path| fs::read_to_string(sb.join("proc/irq/default_smp_affinity")).unwrap_or_default();
    until(&d, "affinities and the default restored", || restored(&sb) && default(&sb).trim() == "ff");
    assert_eq!(irq_file(&sb, 9, "smp_affinity_list"), "3", "IRQ 9 was not the daemon's to restore");
    until(&d, "memory emptied", || memory(&sb)["irqs"].as_object().is_some_and(|m| m.is_empty()));

    // And again: isolating moves them once more.
    reload(&d, ISOLATED);
    until(&d, "isolated again", || irq_file(&sb, 32, "smp_affinity_list") == "0,4");
    assert_eq!(irq_file(&sb, 9, "smp_affinity_list"), "3", "IRQ 9 avoids the isolated CPUs");
    d.stop();
    // Stopping restores (daemon.irq_restore_on_stop defaults to true).
    assert!(restored(&sb), "after stop");
}

#[test]
fn fake_procfs_sigkill_and_restart_keep_the_isolation_and_its_memory() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", Some(ISOLATED), &["--check-interval", "1"]);
    let sb = d.sb.clone();
    assert!(all_movable_on(&sb, "0,4"), "{}", d.logs());
    d.kill();
    // A crash restores nothing, and forgets nothing.
    assert!(all_movable_on(&sb, "0,4"));
    let remembered = memory(&sb);
    for irq in MOVABLE {
        assert_eq!(remembered["irqs"][irq.to_string()], "0-7", "IRQ {irq}");
    }
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", None, &["--check-interval", "1"]);
    assert!(all_movable_on(&sb, "0,4"), "{}", d.logs());
    // The memory survived the restart: the originals, not the daemon's own writes.
    assert_eq!(memory(&sb)["irqs"], remembered["irqs"]);
    // The pool goes: its IRQs come back.
    reload(&d, &ISOLATED.replace("isolate = true\n", ""));
    until(&d, "restored after the restart", || all_movable_on(&sb, "0-7"));
    d.stop();
}

#[test]
fn fake_procfs_restore_on_stop_can_be_turned_off() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let config = format!("[daemon]\nirq_restore_on_stop = false\n{ISOLATED}");
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", Some(&config), &[]);
    let sb = d.sb.clone();
    assert!(all_movable_on(&sb, "0,4"), "{}", d.logs());
    d.stop();
    assert!(all_movable_on(&sb, "0,4"), "kept after stop");
    assert_eq!(memory(&sb)["irqs"]["32"], "0-7");
}

/// A fake irqbalance: its control socket as irqbalance 1.9 serves it (one command per
/// connection, `SCM_CREDENTIALS` of uid 0 required, `setup` answered with `BANNED <mask>`).
/// Records the commands.
struct FakeIrqbalance {
    commands: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl FakeIrqbalance {
    fn start(dir: &Path) -> FakeIrqbalance {
        use nix::sys::socket::{recvmsg, setsockopt, sockopt, ControlMessageOwned, MsgFlags, UnixAddr};
        fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{e}"));
        let path: PathBuf = dir.join("irqbalance4242.sock");
        let listener = UnixListener::bind(&path).unwrap_or_else(|e| panic!("{e}"));
        setsockopt(&listener, sockopt::PassCred, &true).unwrap_or_else(|e| panic!("{e}"));
        let commands = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = commands.clone();
        std::thread::spawn(move || {
            // What irqbalance detected itself at start (no isolcpus= here).
            let mut banned = String::from("00000000");
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let mut buf = [0u8; 16384];
                let mut cmsg = nix::cmsg_space!(nix::libc::ucred);
                let (n, uid) = {
                    let mut iov = [IoSliceMut::new(&mut buf)];
                    let Ok(msg) =
                        recvmsg::<UnixAddr>(conn.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::empty())
                    else {
                        continue;
                    };
                    let uid = msg.cmsgs().ok().and_then(|mut c| {
                        c.find_map(|m| match m {
                            ControlMessageOwned::ScmCredentials(c) => Some(c.uid()),
                            _ => None,
                        })
                    });
                    (msg.bytes, uid)
                };
                let text = String::from_utf8_lossy(&buf[..n]).to_string();
                if uid != Some(0) {
                    // irqbalance ignores callers without root credentials.
                    seen.lock().unwrap_or_else(|e| e.into_inner()).push(format!("REFUSED {text}"));
                    continue;
                }
                if text.starts_with("setup") {
                    let _ = conn.write_all(format!("SLEEP 10 BANNED {banned}").as_bytes());
                } else if let Some(list) = text.strip_prefix("settings cpus ") {
                    banned = match list.trim() {
                        "NULL" => "00000000".to_owned(),
                        l => cpupoold::host::irq::format_mask(
                            &cpupoold::core::cpuset::CpuSet::parse(l).unwrap_or_default(),
                            8,
                        ),
                    };
                }
                let _ = conn.read(&mut [0u8; 1]);
                seen.lock().unwrap_or_else(|e| e.into_inner()).push(text);
            }
        });
        FakeIrqbalance { commands }
    }

    fn commands(&self) -> Vec<String> {
        self.commands.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[test]
fn fake_irqbalance_peer_is_told_the_isolated_cpus_and_given_them_back() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    // The sandbox points paths.irqbalance_dir at DIR/run/irqbalance.
    let fake = FakeIrqbalance::start(&dir.path().join("sb/run/irqbalance"));
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", Some(ISOLATED), &["--check-interval", "1"]);
    let told = |cmd: &str| fake.commands().iter().any(|c| c == cmd);
    assert!(told("settings cpus 1-2,5-6"), "{:?}\n{}", fake.commands(), d.logs());
    assert!(!fake.commands().iter().any(|c| c.starts_with("REFUSED")), "{:?}", fake.commands());
    // Once it says it bans them, it is not told again.
    let n = fake.commands().iter().filter(|c| c.starts_with("settings")).count();
    until(&d, "two more checks", || fake.commands().iter().filter(|c| *c == "setup").count() >= 3);
    assert_eq!(fake.commands().iter().filter(|c| c.starts_with("settings")).count(), n);
    assert!(d.logs().contains("irqbalance"), "{}", d.logs());
    // Isolation ends: irqbalance gets its own choice back.
    reload(&d, &ISOLATED.replace("isolate = true\n", ""));
    until(&d, "irqbalance given back its choice", || told("settings cpus NULL"));
    d.stop();
}

#[test]
fn fake_procfs_one_cpu_reserved_pool_warns_about_irqbalance() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let config =
        ISOLATED.replace("cpus = \"0,4\"", "cpus = \"0\"").replace("cpus = \"3,7\"", "cpus = \"3-4,7\"");
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", Some(&config), &[]);
    assert!(all_movable_on(&d.sb, "0"), "{}", d.logs());
    assert!(d.logs().contains("ConditionCPUs=>1"), "{}", d.logs());
    d.stop();
    // Two reserved CPUs: no warning.
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", Some(ISOLATED), &[]);
    assert!(!d.logs().contains("ConditionCPUs"), "{}", d.logs());
    d.stop();
}

#[test]
fn fake_procfs_a_pool_claims_irqs_by_name() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let config = ISOLATED.replace("isolate = true\n", "isolate = true\nirq_claim = [\"virtio1-*\"]\n");
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", Some(&config), &[]);
    let sb = d.sb.clone();
    // The claimed IRQ goes to exactly dp's CPUs; the others still avoid them.
    assert_eq!(irq_file(&sb, 32, "smp_affinity_list"), "1-2,5-6", "{}", d.logs());
    assert_eq!(irq_file(&sb, 32, "effective_affinity_list"), "1");
    assert_eq!(irq_file(&sb, 24, "smp_affinity_list"), "0,4");
    // The claim goes: IRQ 32 is displaced like the others.
    reload(&d, ISOLATED);
    until(&d, "IRQ 32 unclaimed", || irq_file(&sb, 32, "smp_affinity_list") == "0,4");
    d.stop();
    assert!(all_movable_on(&sb, "0-7"), "restored on stop");
}

/// The sandbox's simulated kernel threads (src/sandbox.rs, sim::kthreads): on
/// 1x4x2:1 every movable one starts on `0-7`, the per-CPU ones on their CPU.
fn allowed(sb: &Path, pid: u32) -> String {
    let status = fs::read_to_string(sb.join(format!("proc/{pid}/status")))
        .unwrap_or_else(|e| panic!("kernel thread {pid}: {e}"));
    status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap_or("").trim().to_owned()
}

fn saved_kthreads(sb: &Path) -> serde_json::Value {
    let text = fs::read_to_string(sb.join("state/housekeeping.json")).unwrap_or_default();
    serde_json::from_str::<serde_json::Value>(&text).map(|v| v["kthreads"].clone()).unwrap_or_default()
}

fn isolation_of(d: &Daemon, pool: &str) -> serde_json::Value {
    let reply = common::Varlink::connect(&d.varlink)
        .call("GetIsolation", serde_json::json!({ "pool": pool }))
        .unwrap_or_else(|e| panic!("GetIsolation: {e:?}"));
    reply["pools"][0].clone()
}

/// kthreadd, oom_reaper, khugepaged, jbd2, kswapd0, kcompactd0.
const MOVABLE_KTHREADS: [u32; 6] = [2, 30, 31, 32, 34, 35];

#[test]
fn fake_procfs_kernel_threads_leave_isolated_cpus_and_come_back() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let sb = dir.path().join("sb");
    cpupoold::sandbox::Sandbox::prepare(&sb, Some("1x4x2:1")).unwrap_or_else(|e| panic!("{e}"));
    // A kernel that puts rcu_preempt back wherever it is told to go.
    fs::write(sb.join("proc/14/sim_kernel_keeps"), "").unwrap_or_else(|e| panic!("{e}"));
    // Preparing wrote the sample configuration: this test's replaces it.
    fs::write(sb.join("etc/cpupoold/config.toml"), ISOLATED).unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", Some(ISOLATED), &["--check-interval", "1"]);
    // Before READY: on the reserved pool's CPUs, the previous CPUs remembered with the thread's
    // start time.
    for pid in MOVABLE_KTHREADS {
        assert_eq!(allowed(&sb, pid), "0,4", "kernel thread {pid}:\n{}", d.logs());
        assert_eq!(saved_kthreads(&sb)[pid.to_string()]["cpus"], "0-7", "{pid}");
    }
    // Bound by the kernel (per-CPU, the unbound kworker): refused, left alone, not remembered.
    for (pid, cpus) in [(101, "1"), (102, "2"), (33, "0-7")] {
        assert_eq!(allowed(&sb, pid), cpus, "{pid}");
        assert!(saved_kthreads(&sb).get(pid.to_string()).is_none(), "{pid}");
    }
    // Kept by the kernel: reported, not counted as moved.
    assert_eq!(allowed(&sb, 14), "0-7");
    assert!(
        d.logs().contains("rcu_preempt (14) was given CPUs 0,4 but the kernel keeps it on 0-7"),
        "{}",
        d.logs()
    );
    let iso = isolation_of(&d, "dp");
    assert_eq!(iso["kthreads"], "6 moved off 1-2,5-6; kept there by the kernel: rcu_preempt (14)", "{iso}");

    // A new kernel thread (a filesystem mounted) is moved at the next check; one someone put
    // back on an isolated CPU too.
    cpupoold::sim::kthreads::write_kthread(
        &sb.join("proc"),
        60,
        "xfsaild/vdb",
        cpupoold::core::housekeeping::PF_KTHREAD,
        &cpupoold::core::cpuset::CpuSet::range(0, 7),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    until(&d, "the new kernel thread moved", || allowed(&sb, 60) == "0,4");
    assert_eq!(saved_kthreads(&sb)["60"]["cpus"], "0-7");

    // A crash restores nothing and forgets nothing; the restart keeps them off.
    d.kill();
    let remembered = saved_kthreads(&sb);
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", None, &["--check-interval", "1"]);
    for pid in MOVABLE_KTHREADS.iter().chain(&[60]) {
        assert_eq!(allowed(&sb, *pid), "0,4", "kernel thread {pid} after the restart:\n{}", d.logs());
    }
    assert_eq!(saved_kthreads(&sb), remembered, "the originals, not the daemon's own writes");
    // A remembered thread that exited and whose pid came back as another is not "restored".
    fs::remove_dir_all(sb.join("proc/30")).unwrap_or_else(|e| panic!("{e}"));
    cpupoold::sim::kthreads::write_kthread(
        &sb.join("proc"),
        30,
        "kworker/R-new",
        cpupoold::core::housekeeping::PF_KTHREAD,
        &cpupoold::core::cpuset::CpuSet::range(0, 0),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    fs::write(
        sb.join("proc/30/stat"),
        fs::read_to_string(sb.join("proc/30/stat")).unwrap_or_default().replace(" 40 0 0 ", " 99 0 0 "),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    until(&d, "the reused pid forgotten", || saved_kthreads(&sb).get("30").is_none());

    // Isolation ends: every thread gets its CPUs back, and the record goes.
    reload(&d, &ISOLATED.replace("isolate = true\n", ""));
    until(&d, "kernel threads restored", || {
        MOVABLE_KTHREADS.iter().chain(&[60]).filter(|p| **p != 30).all(|p| allowed(&sb, *p) == "0-7")
    });
    assert_eq!(allowed(&sb, 30), "0", "the new thread on pid 30 is not the daemon's");
    until(&d, "the record emptied", || saved_kthreads(&sb).as_object().is_none_or(|m| m.is_empty()));
    assert!(d.logs().contains("kernel thread(s) have their CPUs back"), "{}", d.logs());
    d.stop();
}

#[test]
fn fake_procfs_the_sandbox_banner_shows_what_left_the_isolated_pool() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    // A newcomer's first run: the sample configuration, whose dp (1,5 here) is isolated.
    let mut child = test_support::daemon::Reaped(
        std::process::Command::new(env!("CARGO_BIN_EXE_cpupoold"))
            .arg("--sandbox")
            .arg(dir.path().join("sb"))
            .args(["--topology", "1x4x2:1", "--bus", "none"])
            .env_remove("NOTIFY_SOCKET")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{e}")),
    );
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    let mut banner = String::new();
    for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
        let line = line.unwrap_or_else(|e| panic!("{e}"));
        banner.push_str(&line);
        banner.push('\n');
        if line == "READY" {
            break;
        }
    }
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let status = child.wait().unwrap_or_else(|e| panic!("{e}"));
    assert!(banner.contains("\n  pool dp           exclusive CPUs 1,5\n"), "{banner}");
    assert!(
        banner
            .contains("\n  irqs      8 moved off 1,5 (1, 8, 9, 24, 25, ...); 1 placed by the kernel (41)\n"),
        "{banner}"
    );
    assert!(banner.contains("\n  kthreads  7 moved off 1,5\n"), "{banner}");
    assert!(banner.ends_with("READY\n"), "{banner}");
    assert!(status.success(), "{status}");
}

/// Adds IRQ `irq` on every CPU of the 1x4x2 host to the sandbox's procfs, as a device that
/// appears while the daemon runs.
fn add_irq(sb: &Path, irq: u32) {
    let dir = sb.join(format!("proc/irq/{irq}"));
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    for (name, text) in [
        ("smp_affinity", "ff\n"),
        ("smp_affinity_list", "0-7\n"),
        ("effective_affinity_list", "0\n"),
        ("node", "0\n"),
    ] {
        fs::write(dir.join(name), text).unwrap_or_else(|e| panic!("{e}"));
    }
    let mut table = fs::read_to_string(sb.join("proc/interrupts")).unwrap_or_else(|e| panic!("{e}"));
    table.push_str(&format!(
        "{irq:>4}:{}   PCI-MSI 65536-edge      late-device\n",
        format!(" {:>10}", 0).repeat(8)
    ));
    fs::write(sb.join("proc/interrupts"), table).unwrap_or_else(|e| panic!("{e}"));
}

/// `irq.json` keeps its previous copy as the state does: a damaged memory after a crash falls
/// back to `irq.json.prev` (logged, naming both), so the IRQs it remembered get their
/// affinities back when the isolation ends.
#[test]
fn fake_procfs_a_damaged_memory_falls_back_to_its_previous_copy() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", Some(ISOLATED), &["--check-interval", "1"]);
    let sb = d.sb.clone();
    assert!(all_movable_on(&sb, "0,4"), "{}", d.logs());
    // A second save: an IRQ that appears is remembered and moved at the next check.
    add_irq(&sb, 60);
    until(&d, "IRQ 60 moved", || irq_file(&sb, 60, "smp_affinity_list") == "0,4");
    let prev = sb.join("state/irq.json.prev");
    let kept: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&prev).unwrap_or_else(|e| panic!("{e}")))
            .unwrap_or_else(|e| panic!("{e}"));
    for irq in MOVABLE {
        assert_eq!(kept["irqs"][irq.to_string()], "0-7", "IRQ {irq} in irq.json.prev");
    }
    d.kill();
    // The crash left the memory damaged (a disk that lied). Put in as a file of its own: a kill
    // between the two renames of a save leaves irq.json and irq.json.prev one inode (the
    // previous copy is a hard link made just before the new file is renamed into place), and
    // writing into that inode would damage both (seen in loaded runs of the whole suite:
    // "the previous copy cannot be used either").
    let memory = sb.join("state/irq.json");
    let damaged = sb.join("state/damaged.tmp");
    fs::write(&damaged, "{\"irqs\": {\"1\": \"0-").unwrap_or_else(|e| panic!("{e}"));
    fs::rename(&damaged, &memory).unwrap_or_else(|e| panic!("{e}"));

    fs::write(sb.join("etc/cpupoold/config.toml"), ISOLATED.replace("isolate = true\n", ""))
        .unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", None, &["--check-interval", "1"]);
    let logs = d.logs();
    let said = format!("irq: `{}` is not readable", memory.display());
    let line = logs.lines().find(|l| l.contains(&said)).unwrap_or_else(|| panic!("{logs}"));
    assert!(line.contains(&format!("using the previous copy `{}`", prev.display())), "{line}");
    until(&d, "the remembered IRQs restored", || all_movable_on(&sb, "0-7"));
    d.stop();
}
