//! Unit tests of `top.rs`: the screen it draws for known snapshots, at small and wide sizes.
#![allow(clippy::unwrap_used)]

use super::*;
use cpupool_wire::views::{Cpu, CpuHealth, PoolIsolation};
use ratatui::backend::TestBackend;
use ratatui::Terminal;

fn snapshot() -> Snapshot {
    let cpus = (0..4).map(|cpu| Cpu { cpu, core: cpu % 2, package: 0, die: 0, node: 0, l3: 0 }).collect();
    Snapshot {
        status: Status {
            version: "0.1.0".into(),
            uptime_seconds: 65,
            pools: 2,
            assignments: 1,
            state_file: String::new(),
            config_error: None,
            degraded_assignments: 0,
            containers: None,
        },
        pools: vec![
            Pool {
                name: "dp".into(),
                kind: "exclusive".into(),
                cpus: "1,3".into(),
                free_cpus: "".into(),
                free_millicpus: 0,
                capacity_millicpus: 2000,
                isolated: true,
                assignments: 1,
                partition: "isolated".into(),
            },
            Pool {
                name: "reserved".into(),
                kind: "reserved".into(),
                cpus: "0,2".into(),
                free_cpus: "0,2".into(),
                free_millicpus: 2000,
                capacity_millicpus: 2000,
                isolated: false,
                assignments: 0,
                partition: String::new(),
            },
        ],
        assignments: vec![Assignment {
            id: "app-1".into(),
            pool: "dp".into(),
            cpus: "1,3".into(),
            millicpus: 2000,
            target: "cgroup:app".into(),
            reclaim: true,
            container: String::new(),
            state: "applied".into(),
            reason: String::new(),
        }],
        topology: Topology { online: "0-3".into(), offline: "".into(), isolated: "".into(), cpus },
        isolation: Isolation {
            pools: vec![PoolIsolation {
                pool: "dp".into(),
                cpus: "1,3".into(),
                state: "leaks".into(),
                summary: "71 IRQ/s from irq 32 virtio1-requests on CPU 1".into(),
                reason: String::new(),
                foreign_percent: 2.5,
                per_cpu: vec![CpuHealth {
                    cpu: 1,
                    device_irqs_per_sec: 71.0,
                    ipis_per_sec: 3.0,
                    timer_per_sec: 0.5,
                    sources: "32 virtio1-requests 71/s".into(),
                    noise: Vec::new(),
                }],
                irqs: String::new(),
                kthreads: String::new(),
                boot: String::new(),
            }],
            ..Default::default()
        },
    }
}

fn screen(view: &View, w: u16, h: u16) -> String {
    let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
    t.draw(|f| draw(f, view)).unwrap();
    let buf = t.backend().buffer().clone();
    (0..h)
        .map(|y| {
            (0..w).map(|x| buf[(x, y)].symbol().to_owned()).collect::<String>().trim_end().to_owned() + "\n"
        })
        .collect()
}

#[test]
fn the_view_shows_pools_cpus_isolation_and_assignments() {
    let view = View { snapshot: Some(snapshot()), problem: None, interval: Duration::from_secs(1) };
    let s = screen(&view, 110, 30);
    assert!(s.starts_with("cpupoold 0.1.0  up 1m 5s  2 pools  1 assignment  every 1s  q quits\n"), "{s}");
    let dp = s.lines().find(|l| l.contains(" dp ")).unwrap_or_else(|| panic!("{s}"));
    for needle in ["exclusive", "2000m / 2000m", "██████████ 100%", " 1 ", "leaks, foreign 2.5%"]
    {
        assert!(dp.contains(needle), "{needle:?} not in {dp:?}\n{s}");
    }
    assert!(s.contains("r0    [d1]* r2    [d3]*"), "{s}");
    let cpu1 = s.lines().find(|l| l.contains("32 virtio1-requests 71/s")).unwrap_or_else(|| panic!("{s}"));
    assert!(cpu1.contains("71.0") && cpu1.contains("3.0") && cpu1.contains("0.5"), "{cpu1}");
    assert!(s.contains("app-1") && s.contains("cgroup:app"), "{s}");
    assert!(s.contains("not measured CPU time"), "{s}");
}

#[test]
fn a_state_that_is_its_own_summary_is_said_once() {
    let mut snap = snapshot();
    for (state, summary) in [("holds", "holds"), ("degraded", "degraded: no isolated partition")] {
        snap.isolation.pools[0].state = state.into();
        snap.isolation.pools[0].summary = summary.into();
        let view = View { snapshot: Some(snap.clone()), problem: None, interval: Duration::from_secs(1) };
        let s = screen(&view, 120, 30);
        assert!(s.contains(summary), "{s}");
        assert!(!s.contains(&format!("{state}: {state}")), "{s}");
    }
}

#[test]
fn a_failed_refresh_keeps_the_picture_and_says_so() {
    let view = View {
        snapshot: Some(snapshot()),
        problem: Some("error: cannot reach cpupoold".into()),
        interval: Duration::from_millis(500),
    };
    let s = screen(&view, 100, 30);
    assert!(s.lines().nth(1).is_some_and(|l| l.starts_with("stale: error: cannot reach cpupoold")), "{s}");
    assert!(s.contains(" dp "), "{s}");
    let first =
        View { snapshot: None, problem: Some("error: nope".into()), interval: Duration::from_secs(1) };
    assert!(screen(&first, 60, 5).starts_with("cpupoolctl top: error: nope (retrying; q quits)"));
}

/// A 2x8x2 host's view: 4 pools, 32 CPUs, 3 assignments, 14 isolated CPUs measured.
fn big_snapshot() -> Snapshot {
    let mut snap = snapshot();
    snap.topology.online = "0-31".into();
    snap.topology.cpus = (0..32)
        .map(|cpu| Cpu { cpu, core: cpu % 16, package: cpu / 8 % 2, die: 0, node: cpu / 8 % 2, l3: 0 })
        .collect();
    let pool = |name: &str, kind: &str, cpus: &str, n: u64, isolated: bool| Pool {
        name: name.into(),
        kind: kind.into(),
        cpus: cpus.into(),
        free_cpus: cpus.into(),
        free_millicpus: n * 1000,
        capacity_millicpus: n * 1000,
        isolated,
        assignments: 0,
        partition: if isolated { "isolated".into() } else { String::new() },
    };
    snap.pools = vec![
        pool("batch", "exclusive", "5-6,21-22", 4, false),
        pool("dp", "exclusive", "8-14,24-30", 14, true),
        pool("reserved", "reserved", "0,7,15-16,23,31", 6, false),
        pool("web", "shared", "1-4,17-20", 8, false),
    ];
    snap.status.pools = 4;
    snap.status.assignments = 3;
    snap.assignments = (1..=3)
        .map(|i| Assignment {
            id: format!("analytics-worker-{i}"),
            pool: "web".into(),
            cpus: "1-4,17-20".into(),
            millicpus: 500,
            target: format!("cgroup:cpupool.slice/cpupool-web.slice/worker-{i}"),
            reclaim: true,
            container: String::new(),
            state: "applied".into(),
            reason: String::new(),
        })
        .collect();
    let iso = &mut snap.isolation.pools[0];
    iso.cpus = "8-14,24-30".into();
    iso.per_cpu = [8, 9, 10, 11, 12, 13, 14, 24, 25, 26, 27, 28, 29, 30]
        .iter()
        .map(|cpu| CpuHealth {
            cpu: *cpu,
            device_irqs_per_sec: 0.0,
            ipis_per_sec: 0.0,
            timer_per_sec: 0.0,
            sources: String::new(),
            noise: Vec::new(),
        })
        .collect();
    snap
}

/// At 80x24 not everything fits: every pool and assignment still shows, and what does
/// not (the isolation detail) is counted in the footer, never left out silently.
#[test]
fn a_small_terminal_says_what_is_not_shown() {
    let view = View { snapshot: Some(big_snapshot()), problem: None, interval: Duration::from_secs(1) };
    let s = screen(&view, 80, 24);
    for pool in ["batch", "dp", "reserved", "web"] {
        assert!(s.lines().any(|l| l.contains(&format!(" {pool} "))), "{pool} not shown:\n{s}");
    }
    for i in 1..=3 {
        assert!(s.contains(&format!("analytics-worker-{i}")), "assignment {i} not shown:\n{s}");
    }
    let last = s.lines().last().unwrap_or_default();
    assert!(last.starts_with("… not shown: ") && last.ends_with(" (enlarge the terminal)"), "{s}");
    assert!(last.contains("isolation rows"), "{s}");
    // Smaller still: pools and assignments are counted too.
    let s = screen(&view, 80, 12);
    let last = s.lines().last().unwrap_or_default();
    assert!(last.contains("3 assignments") && last.contains("isolation rows"), "{s}");
    assert!(s.lines().count() <= 12, "{s}");
    // With room for everything, the footer says what USE is.
    let s = screen(&view, 120, 60);
    assert!(s.lines().last().unwrap_or_default().starts_with("USE: "), "{s}");
    assert!(!s.contains("not shown"), "{s}");
}

/// At 120 columns the CPU lists, ids and targets are shown whole: columns are as wide as
/// what they show, and the spare width goes to the last one.
#[test]
fn a_wide_terminal_shows_lists_and_ids_whole() {
    let view = View { snapshot: Some(big_snapshot()), problem: None, interval: Duration::from_secs(1) };
    let s = screen(&view, 120, 60);
    for whole in [
        "0,7,15-16,23,31",
        "8-14,24-30",
        "analytics-worker-3",
        "cgroup:cpupool.slice/cpupool-web.slice/worker-3",
    ] {
        assert!(s.contains(whole), "{whole} is cut:\n{s}");
    }
}

#[test]
fn bars_and_keys() {
    assert_eq!(bar(500, 2000), "██░░░░░░░░  25%");
    assert_eq!(bar(0, 0), "░░░░░░░░░░   0%");
    let key = |code, modifiers| KeyEvent::new(code, modifiers);
    assert!(quits(&key(KeyCode::Char('q'), KeyModifiers::NONE)));
    assert!(quits(&key(KeyCode::Esc, KeyModifiers::NONE)));
    assert!(quits(&key(KeyCode::Char('c'), KeyModifiers::CONTROL)));
    assert!(!quits(&key(KeyCode::Char('c'), KeyModifiers::NONE)));
}
