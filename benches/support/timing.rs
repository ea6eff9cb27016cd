//! Timing helpers shared by the benchmarks (included with `#[path]`; a file in a subdirectory
//! of `benches/` is not a bench target of its own). Each bench uses what it needs.
#![allow(dead_code)]

use std::time::{Duration, Instant};

/// The median and the 99th percentile of a run of calls.
pub struct Stats {
    pub p50: Duration,
    pub p99: Duration,
}

/// Times `n` calls of `f` one by one, after `n / 10` calls of warm-up.
pub fn measure(n: usize, mut f: impl FnMut(usize)) -> Stats {
    for i in 0..n / 10 {
        f(i); // warm-up
    }
    let mut times: Vec<Duration> = (0..n)
        .map(|i| {
            let t = Instant::now();
            f(i);
            t.elapsed()
        })
        .collect();
    times.sort();
    Stats { p50: times[n / 2], p99: times[n * 99 / 100] }
}

/// ns per call of `f`, over enough calls to take about `budget_ms` (at least `min` calls), after
/// up to `warm` calls of warm-up.
pub fn ns_per_op(budget_ms: u64, min: usize, warm: usize, mut f: impl FnMut(usize)) -> f64 {
    for i in 0..min.min(warm) {
        f(i); // warm-up
    }
    let start = Instant::now();
    let mut n = 0;
    while n < min || start.elapsed().as_millis() < u128::from(budget_ms) {
        f(n);
        n += 1;
    }
    start.elapsed().as_nanos() as f64 / n as f64
}

/// The median and the 99th percentile of `t`, times taken one by one in a loop of several calls.
pub fn percentiles(mut t: Vec<Duration>) -> (Duration, Duration) {
    t.sort();
    (t[t.len() / 2], t[(t.len() * 99 / 100).min(t.len() - 1)])
}

/// Prints `name`'s p50 and p99 in µs, each with its ratio to the floor's.
pub fn ratio_row(name: &str, (p50, p99): (Duration, Duration), (f50, f99): (Duration, Duration)) {
    println!(
        "{name:<50} p50 {:>8.1} µs (×{:>5.1})  p99 {:>8.1} µs (×{:>5.1})",
        p50.as_secs_f64() * 1e6,
        p50.as_secs_f64() / f50.as_secs_f64(),
        p99.as_secs_f64() * 1e6,
        p99.as_secs_f64() / f99.as_secs_f64()
    );
}
