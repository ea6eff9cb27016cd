//! Unit tests of `map.rs`: CPU lists, pool letters, and the exact picture and JSON of known hosts.
#![allow(clippy::unwrap_used)]

use super::*;
use cpupool_wire::views::Cpu;

fn pool(name: &str, kind: &str, cpus: &str, isolated: bool) -> Pool {
    Pool {
        name: name.into(),
        kind: kind.into(),
        cpus: cpus.into(),
        free_cpus: cpus.into(),
        free_millicpus: 0,
        capacity_millicpus: 0,
        isolated,
        assignments: 0,
        partition: if isolated { "isolated".into() } else { String::new() },
    }
}

fn assignment(id: &str, pool: &str, cpus: &str) -> Assignment {
    Assignment {
        id: id.into(),
        pool: pool.into(),
        cpus: cpus.into(),
        millicpus: 1000,
        target: format!("cgroup:{id}"),
        reclaim: true,
        container: String::new(),
        state: "applied".into(),
        reason: String::new(),
    }
}

/// `sockets` x `cores` x `threads`, Linux numbering (siblings `c` and `c + total cores`),
/// one node and one L3 per socket.
fn topo(sockets: u32, cores: u32, threads: u32) -> Topology {
    let total = sockets * cores;
    let mut cpus = Vec::new();
    for t in 0..threads {
        for c in 0..total {
            let package = c / cores;
            cpus.push(Cpu {
                cpu: t * total + c,
                core: c,
                package,
                die: 0,
                node: package,
                l3: package * cores,
            });
        }
    }
    cpus.sort_by_key(|c| c.cpu);
    let n = sockets * cores * threads;
    Topology { online: format!("0-{}", n - 1), offline: String::new(), isolated: String::new(), cpus }
}

#[test]
fn cpu_lists_parse_and_bad_ones_are_named() {
    assert_eq!(cpu_list("0-2,5, 7").unwrap(), [0, 1, 2, 5, 7]);
    assert_eq!(cpu_list("").unwrap(), Vec::<u32>::new());
    assert_eq!(cpu_list("3-1").unwrap_err(), "range `3-1` in `3-1` runs backwards");
    assert_eq!(cpu_list("1,x").unwrap_err(), "`x` in `1,x` is not a CPU number");
    assert!(cpu_list("0-4294967295").is_err());
    let mut bad = pool("dp", "exclusive", "2-x", false);
    bad.cpus = "2-x".into();
    let e = HostMap::build(&topo(1, 2, 1), &[bad], &[]).unwrap_err();
    assert!(e.to_string().contains("pool `dp` field `cpus`: `x` in `2-x`"), "{e}");
}

#[test]
fn letters_are_first_free_characters() {
    assert_eq!(letters(&["dp", "dpdk", "reserved", "web", "web2"]), ['d', 'p', 'r', 'w', 'e']);
    assert_eq!(letters(&["a", "a_", "__"]), ['a', 'b', 'c']);
}

#[test]
fn a_small_host_drawn_plain() {
    let mut t = topo(1, 4, 2);
    t.isolated = "3".into();
    t.offline = "9".into();
    let pools = [
        pool("reserved", "reserved", "0,4", false),
        pool("dp", "exclusive", "2,6", true),
        pool("web", "shared", "1,3,5,7", false),
    ];
    let map =
        HostMap::build(&t, &pools, &[assignment("app-1", "dp", "2,6"), assignment("w", "web", "1")]).unwrap();
    assert_eq!(map.held.len(), 1, "shared assignments hold no CPUs");
    let text = render(&map, Style { colour: false, width: 80 });
    assert_eq!(
        text,
        "\
8 CPUs online, 1 offline: 1 package, 1 NUMA node, 1 L3 group, 4 cores

package 0 / node 0 / L3 0: 4 cores, 8 CPUs
   r0    w1   [d2]* [w3]
   r4    w5   [d6]*  w7

offline (the kernel gives no place for an offline CPU)
  x9

pools
  d  dp        exclusive, isolated  green  2,6
  r  reserved  reserved             grey   0,4
  w  web       shared               blue   1,3,5,7

marks
  [d4]  isolated: in an isolated partition, or by the kernel (isolcpus=)
  d4*   held by an exclusive assignment (listed below)
  x15   offline
  isolcpus=: 3

held exclusive CPUs
  ID     POOL  CPUS  TARGET
  app-1  dp    2,6   cgroup:app-1
"
    );
}

/// Colour adds escapes and nothing else: without them it is the plain picture.
#[test]
fn colour_only_adds_escapes() {
    let t = topo(2, 2, 2);
    let pools = [pool("reserved", "reserved", "0,4", false), pool("dp", "exclusive", "1-3,5-7", true)];
    let map = HostMap::build(&t, &pools, &[assignment("a", "dp", "1,5")]).unwrap();
    let plain = render(&map, Style { colour: false, width: 80 });
    let coloured = render(&map, Style { colour: true, width: 80 });
    assert!(coloured.contains("\x1b[32;4;1m[d1]*\x1b[0m"), "{coloured}");
    assert!(coloured.contains("\x1b[90m r0\x1b[0m"), "{coloured}");
    assert_eq!(strip_ansi(&coloured), plain);
}

pub(crate) fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A 1024-CPU host fits the width (80 columns, or a wider terminal's), wrapping each L3
/// group's grid.
#[test]
fn a_big_host_wraps_within_the_width() {
    let t = topo(2, 256, 2);
    let pools = [
        pool("reserved", "reserved", "0,512", false),
        pool("dp", "exclusive", "1-255,513-767", true),
        pool("web", "shared", "256-511,768-1023", false),
    ];
    let map = HostMap::build(&t, &pools, &[assignment("big", "dp", "1-100,513-612")]).unwrap();
    for width in [80, 132] {
        let text = render(&map, Style { colour: false, width });
        let too_long: Vec<&str> = text.lines().filter(|l| l.chars().count() > width).collect();
        assert!(too_long.is_empty(), "width {width}: {too_long:?}");
        // Every CPU is drawn exactly once.
        for cpu in [0, 511, 1023] {
            let needle = format!("{cpu}");
            assert!(text.split_whitespace().any(|w| w.trim_matches(|c: char| !c.is_ascii_digit()) == needle));
        }
    }
    let text = render(&map, Style { colour: false, width: 80 });
    assert!(
        text.starts_with("1024 CPUs online: 2 packages, 2 NUMA nodes, 2 L3 groups, 512 cores\n"),
        "{text}"
    );
}

#[test]
fn json_has_the_nesting_and_each_cpu() {
    let t = topo(1, 2, 2);
    let pools = [pool("reserved", "reserved", "0,2", false), pool("dp", "exclusive", "1,3", true)];
    let map = HostMap::build(&t, &pools, &[assignment("a", "dp", "1,3")]).unwrap();
    let v = serde_json::to_value(&map).unwrap();
    assert_eq!(
        v["packages"][0]["nodes"][0]["l3_groups"][0]["cores"][1],
        serde_json::json!({"core": 1, "threads": [
            {"cpu": 1, "pool": "dp", "assignment": "a", "isolated_partition": true, "kernel_isolated": false},
            {"cpu": 3, "pool": "dp", "assignment": "a", "isolated_partition": true, "kernel_isolated": false}
        ]})
    );
    assert_eq!(v["pools"][0]["letter"], "d");
}
