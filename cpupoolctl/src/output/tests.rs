//! Unit tests of `output.rs`: the exact text and JSON it prints for known replies.
#![allow(clippy::unwrap_used)]

use super::*;
use cpupool_wire::views::Cpu;

fn dp() -> Pool {
    Pool {
        name: "dp".into(),
        kind: "exclusive".into(),
        cpus: "2-3,6-7".into(),
        free_cpus: "".into(),
        free_millicpus: 0,
        capacity_millicpus: 4000,
        isolated: true,
        assignments: 2,
        partition: "isolated".into(),
    }
}

fn web() -> Pool {
    Pool {
        name: "web".into(),
        kind: "shared".into(),
        cpus: "1,5".into(),
        free_cpus: "1,5".into(),
        free_millicpus: 1750,
        capacity_millicpus: 2000,
        isolated: false,
        assignments: 1,
        partition: "member".into(),
    }
}

#[test]
fn pool_table_is_aligned() {
    assert_eq!(
        pools(&[dp(), web()]),
        "\
NAME  KIND       CPUS     FREE CPUS   FREE  CAPACITY  ISOLATED  ASSIGNMENTS
dp    exclusive  2-3,6-7  -             0m     4000m  isolated            2
web   shared     1,5      1,5        1750m     2000m  no                  1
"
    );
}

#[test]
fn pool_block() {
    assert_eq!(
        pool(&web()),
        "\
name:         web
kind:         shared
cpus:         1,5
free cpus:    1,5
free:         1750m of 2000m
isolated:     no
assignments:  1
"
    );
}

#[test]
fn assignment_outputs() {
    let a = Assignment {
        id: "app-1".into(),
        pool: "dp".into(),
        cpus: "2,6".into(),
        millicpus: 2000,
        target: "cgroup:work/app".into(),
        reclaim: true,
        container: String::new(),
        state: "applied".into(),
        reason: String::new(),
    };
    let b = Assignment {
        id: "x".into(),
        pool: "web".into(),
        cpus: "1,5".into(),
        millicpus: 250,
        target: "pid:7".into(),
        reclaim: true,
        container: String::new(),
        state: "applied".into(),
        reason: String::new(),
    };
    assert_eq!(
        assignments(&[a.clone(), b], None),
        "\
ID     POOL  CPUS  MILLICPUS  STATE    TARGET
app-1  dp    2,6       2000m  applied  cgroup:work/app
x      web   1,5        250m  applied  pid:7
"
    );
    assert_eq!(assignments(&[], None), "no assignments\n");
    assert_eq!(assignments(&[], Some("dp")), "no assignments in pool `dp`\n");
    assert_eq!(
        assignment(&a),
        "id:         app-1\npool:       dp\ncpus:       2,6\nmillicpus:  2000m\ntarget:     cgroup:work/app\nstate:      applied\n"
    );
    assert_eq!(released(&a), "released `app-1`: pool dp, CPUs 2,6, 2000m, cgroup:work/app\n");
    assert_eq!(assignment_json(&a)["assignment"]["millicpus"], 2000);

    let k = Assignment {
        id: "kubelet-core-6".into(),
        pool: "dp".into(),
        cpus: "6,14".into(),
        millicpus: 2000,
        target: "cgroup:kubepods.slice/ctr.scope".into(),
        reclaim: true,
        container: "default/web-0/nginx".into(),
        state: "degraded".into(),
        reason: "target `cgroup:kubepods.slice/ctr.scope` cannot run on CPUs 6,14".into(),
    };
    assert_eq!(
        assignments(&[a, k.clone()], None),
        "\
ID              POOL  CPUS  MILLICPUS  STATE     TARGET                           CONTAINER
app-1           dp    2,6       2000m  applied   cgroup:work/app
kubelet-core-6  dp    6,14      2000m  degraded  cgroup:kubepods.slice/ctr.scope  default/web-0/nginx
kubelet-core-6 is degraded: target `cgroup:kubepods.slice/ctr.scope` cannot run on CPUs 6,14
"
    );
    assert!(assignment(&k).ends_with("container:  default/web-0/nginx\n"), "{}", assignment(&k));

    // Booked by the kubelet, its container not running yet: allocated, no reason line.
    let booked = Assignment {
        id: "kubelet-core-2".into(),
        target: "kubelet:core-2".into(),
        container: String::new(),
        state: "allocated".into(),
        reason: String::new(),
        ..k
    };
    assert_eq!(
        assignments(&[booked], None),
        "\
ID              POOL  CPUS  MILLICPUS  STATE      TARGET
kubelet-core-2  dp    6,14      2000m  allocated  kubelet:core-2
"
    );
}

#[test]
fn topology_and_status() {
    let t = Topology {
        online: "0-1".into(),
        offline: "".into(),
        isolated: "".into(),
        cpus: vec![
            Cpu { cpu: 0, core: 0, package: 0, die: 0, node: 0, l3: 0 },
            Cpu { cpu: 1, core: 0, package: 0, die: 0, node: 0, l3: 0 },
        ],
    };
    assert_eq!(
        topology(&t),
        "\
online:    0-1
offline:   -
isolated:  -

CPU  CORE  PACKAGE  DIE  NODE  L3
  0     0        0    0     0   0
  1     0        0    0     0   0
"
    );
    let mut s = Status {
        version: "0.1.0".into(),
        uptime_seconds: 93784,
        pools: 3,
        assignments: 0,
        state_file: "/var/lib/cpupoold/state.json".into(),
        config_error: None,
        degraded_assignments: 0,
        containers: None,
    };
    let text = status(&s, &[], &Isolation::default());
    assert!(text.starts_with("version:        0.1.0\nuptime:         1d 2h 3m 4s\n"), "{text}");
    assert!(text.ends_with("configuration:  running as on disk\nclasses:        none\n"), "{text}");
    // config_error is always in the JSON document, null when absent.
    assert_eq!(serde_json::to_value(&s).unwrap()["config_error"], Value::Null);
    s.config_error = Some("pools.dp.count: must be at least 1".into());
    assert!(status(&s, &[], &Isolation::default()).contains("NOT the one on disk: pools.dp.count"));
}

/// The column where a `key: value` line's value starts.
fn value_column(line: &str) -> usize {
    let colon = line.find(": ").unwrap_or_else(|| panic!("{line:?}"));
    colon + 1 + line[colon + 1..].chars().take_while(|c| *c == ' ').count()
}

/// `status` and `pool show` print their parts (the daemon or pool, the classes, the
/// isolation) as one block: every value starts in the same column.
#[test]
fn status_and_pool_show_align_every_part_alike() {
    let s = Status {
        version: "0.1.0".into(),
        uptime_seconds: 5,
        pools: 3,
        assignments: 1,
        state_file: "/var/lib/cpupoold/state.json".into(),
        config_error: None,
        degraded_assignments: 0,
        containers: Some("NRI".into()),
    };
    let iso = Isolation {
        pools: vec![cpupool_wire::views::PoolIsolation {
            pool: "dp".into(),
            cpus: "2-3,6-7".into(),
            state: "holds".into(),
            summary: "holds".into(),
            reason: String::new(),
            foreign_percent: -1.0,
            per_cpu: Vec::new(),
            irqs: "8 moved off 2-3,6-7".into(),
            kthreads: "7 moved off 2-3,6-7".into(),
            boot: String::new(),
        }],
        ..Default::default()
    };
    let classes = vec![ClassSetting {
        pool: "dp".into(),
        class: "cache".into(),
        key: "l3".into(),
        wanted: "50%".into(),
        state: "applied".into(),
        in_force: "fc0".into(),
        scope: "cpupool-dp".into(),
        reason: String::new(),
    }];
    let text = status(&s, &classes, &iso);
    assert!(text.contains("\nclasses:         dp cache\n"), "{text}");
    assert!(text.contains("\nisolation dp:    holds\n"), "{text}");
    let columns: Vec<usize> = text.lines().map(value_column).collect();
    assert!(columns.iter().all(|c| *c == columns[0]), "status:\n{text}");

    let mut degraded = Assignment {
        id: "app-1".into(),
        pool: "dp".into(),
        cpus: "2,6".into(),
        millicpus: 2000,
        target: "cgroup:cpupool.slice/cpupool-dp.slice/app".into(),
        reclaim: true,
        container: String::new(),
        state: "degraded".into(),
        reason: "the kernel enforces 2-3".into(),
    };
    let text = pool_show(&dp(), std::slice::from_ref(&degraded), &iso, &classes);
    let (block, listed) = text.split_once("classes:\n").unwrap_or_else(|| panic!("{text}"));
    assert_eq!(listed, "  cache.l3 = 50%: applied (fc0 in cpupool-dp)\n");
    assert!(block.contains("\nkernel threads:  7 moved off 2-3,6-7\n"), "{text}");
    assert!(block.contains("\ndegraded:        assignment app-1 ("), "{text}");
    let columns: Vec<usize> = block.lines().map(value_column).collect();
    assert!(columns.iter().all(|c| *c == columns[0]), "pool show:\n{text}");
    assert_eq!(columns[0], value_column(status(&s, &classes, &iso).lines().next().unwrap_or_default()));
    degraded.state = "applied".into();
    assert!(!pool_show(&dp(), &[degraded], &iso, &[]).contains("degraded"));
}

#[test]
fn durations() {
    assert_eq!(duration(0), "0s");
    assert_eq!(duration(59), "59s");
    assert_eq!(duration(3600), "1h 0m 0s");
    assert_eq!(duration(86400 + 5), "1d 0h 0m 5s");
}

#[test]
fn events() {
    assert_eq!(event(&Event::pool("web", "changed")), "pool        web                   changed\n");
    assert_eq!(event(&Event::assignment("a-1", "added")), "assignment  a-1                   added\n");
    assert_eq!(
        serde_json::to_value(Event::pool("web", "current")).unwrap(),
        json!({"kind": "pool", "pool": "web", "change": "current"})
    );
}

#[test]
fn json_documents_mirror_the_varlink_replies() {
    let v = pools_json(&[web()]);
    assert_eq!(v["pools"][0]["free_millicpus"], 1750);
    assert_eq!(pool_json(&dp())["pool"]["isolated"], true);
    assert_eq!(assignments_json(&[]), json!({"assignments": []}));
}

/// `pool show` lists what still interrupts each isolated CPU, busiest first and zeros left
/// out, and whether the kernel's boot isolation covers the pool; `isolation boot-line` prints
/// the line alone and says on the side what the running kernel leaves undone.
#[test]
fn pool_show_lists_the_noise_by_source_and_the_boot_coverage() {
    use cpupool_wire::views::{CpuHealth, Noise, PoolIsolation};
    let noise = |pairs: &[(&str, f64)]| -> Vec<Noise> {
        pairs.iter().map(|(s, r)| Noise { source: (*s).into(), per_sec: *r }).collect()
    };
    let cpu = |cpu, n| CpuHealth {
        cpu,
        device_irqs_per_sec: 0.0,
        ipis_per_sec: 0.0,
        timer_per_sec: 0.0,
        sources: String::new(),
        noise: n,
    };
    let iso = Isolation {
        pools: vec![PoolIsolation {
            pool: "dp".into(),
            cpus: "2-3".into(),
            state: "holds".into(),
            summary: "holds".into(),
            reason: String::new(),
            foreign_percent: -1.0,
            per_cpu: vec![
                cpu(2, noise(&[("ipi:CAL", 208.0), ("timer:LOC", 0.0), ("softirq:SCHED", 208.0)])),
                cpu(3, noise(&[("timer:LOC", 230.0), ("softirq:RCU", 78.0), ("sched:switched_in", 0.5)])),
                cpu(6, noise(&[("timer:LOC", 0.0)])),
            ],
            irqs: String::new(),
            kthreads: String::new(),
            boot: "nohz_full= misses 2-3; rcu_nocbs= misses 2-3".into(),
        }],
        boot_line: "nohz_full=2-3 rcu_nocbs=2-3 isolcpus=managed_irq,2-3".into(),
        boot_unused: "6".into(),
        ..Default::default()
    };
    let text = pool_show(&dp(), &[], &iso, &[]);
    let line = |key: &str| {
        text.lines().find(|l| l.starts_with(key)).map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
    };
    assert_eq!(
        line("noise cpu 2:").as_deref(),
        Some("noise cpu 2: ipi:CAL 208/s, softirq:SCHED 208/s"),
        "{text}"
    );
    assert_eq!(
        line("noise cpu 3:").as_deref(),
        Some("noise cpu 3: timer:LOC 230/s, softirq:RCU 78/s, sched:switched_in 0.5/s"),
        "{text}"
    );
    assert_eq!(line("noise cpu 6:").as_deref(), Some("noise cpu 6: none"), "{text}");
    assert_eq!(
        line("boot:").as_deref(),
        Some("boot: nohz_full= misses 2-3; rcu_nocbs= misses 2-3 (cpupoolctl isolation boot-line)"),
        "{text}"
    );
    let columns: Vec<usize> = text.lines().map(value_column).collect();
    assert!(columns.iter().all(|c| *c == columns[0]), "pool show:\n{text}");
    assert_eq!(boot_line(&iso), "nohz_full=2-3 rcu_nocbs=2-3 isolcpus=managed_irq,2-3\n");
    assert_eq!(boot_line(&Isolation::default()), "");
    let problems = boot_problems(&iso);
    assert_eq!(
        problems[0],
        ("pool dp".to_owned(), "nohz_full= misses 2-3; rcu_nocbs= misses 2-3".to_owned())
    );
    assert_eq!(problems[1].1, "CPUs 6 are isolated at boot but in no isolated pool");
    assert_eq!(boot_line_json(&iso)["pools"][0]["boot"], "nohz_full= misses 2-3; rcu_nocbs= misses 2-3");
    let doc = pool_show_json(&dp(), &[], &iso);
    assert_eq!(doc["isolation"]["per_cpu"][1]["noise"][1], json!({"source": "softirq:RCU", "per_sec": 78.0}));
    assert_eq!(doc["isolation"]["boot"], iso.pools[0].boot);
    assert!(pool_show_json(&web(), &[], &Isolation::default()).get("isolation").is_none());
}
