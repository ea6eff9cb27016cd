//! Logging: to the journal with structured fields when our stderr is connected to it
//! (`JOURNAL_STREAM`), otherwise human lines on stderr with the fields appended.
//!
//! Both loggers pass records through one [`Filter`]: our own records (target `cpupoold` or
//! `cpupoold::...`) at the configured level (`log::max_level()`: `--log-level`, else
//! `daemon.log_level`, which a reload changes), and everything else at `warn`. Everything else
//! is the libraries: with the `k8s` feature, `tracing` forwards zbus's and hyper's events and
//! spans to `log` (targets `zbus::...`, `tracing::span`, `tracing::span::active`), and its
//! span enter/exit records are at trace even when the span's own level passed the max level,
//! so a global level alone lets them through. Only `log_level = "trace"` (or `--log-level trace`)
//! lets the libraries log below `warn` too.

use std::io::Write;

use log::kv::{Key, Value, VisitSource};
use log::{Level, LevelFilter, Log, Metadata, Record};

/// Whether `--log-level` set the level: `daemon.log_level` then never changes it.
static LEVEL_FROM_COMMAND_LINE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Keeps the level `--log-level` gave over `daemon.log_level`, at start and on every reload.
pub fn keep_command_line_level() {
    LEVEL_FROM_COMMAND_LINE.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Sets the level `daemon.log_level` gives (at start and on every reload), unless `--log-level`
/// set it ([`keep_command_line_level`]).
pub fn configure(level: LevelFilter) {
    if !LEVEL_FROM_COMMAND_LINE.load(std::sync::atomic::Ordering::Relaxed) {
        log::set_max_level(level);
    }
}

/// Installs the logger. Returns whether the journal is used.
pub fn init(level: LevelFilter) -> bool {
    log::set_max_level(level);
    if systemd_journal_logger::connected_to_journal() {
        if let Ok(j) = systemd_journal_logger::JournalLog::new() {
            let j = j
                .with_extra_fields(vec![("CPUPOOLD_VERSION", env!("CARGO_PKG_VERSION"))])
                .with_syslog_identifier("cpupoold".to_owned());
            if log::set_boxed_logger(Box::new(Filtered(j))).is_ok() {
                return true;
            }
        }
    }
    let _ = log::set_boxed_logger(Box::new(Filtered(Stderr)));
    false
}

/// Which records pass, given the configured level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Filter {
    /// Our own records' level.
    pub level: LevelFilter,
}

impl Filter {
    /// The filter for the level in force now (`log::max_level()`).
    pub fn current() -> Filter {
        Filter { level: log::max_level() }
    }

    /// Whether a record of `level` from `target` is logged.
    pub fn enabled(self, target: &str, level: Level) -> bool {
        level <= self.level_for(target)
    }

    /// The level records of `target` are logged at.
    pub fn level_for(self, target: &str) -> LevelFilter {
        let ours = target == "cpupoold" || target.starts_with("cpupoold::");
        if ours || self.level == LevelFilter::Trace {
            self.level
        } else {
            self.level.min(LevelFilter::Warn)
        }
    }
}

/// A logger that drops what [`Filter`] refuses before `L` sees it.
struct Filtered<L>(L);

impl<L: Log> Log for Filtered<L> {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        Filter::current().enabled(m.target(), m.level()) && self.0.enabled(m)
    }

    fn log(&self, record: &Record<'_>) {
        if self.enabled(record.metadata()) {
            self.0.log(record);
        }
    }

    fn flush(&self) {
        self.0.flush();
    }
}

struct Stderr;

struct Fields(String);

impl<'kvs> VisitSource<'kvs> for Fields {
    fn visit_pair(&mut self, key: Key<'kvs>, value: Value<'kvs>) -> Result<(), log::kv::Error> {
        self.0.push_str(&format!(" {key}={value}"));
        Ok(())
    }
}

impl Log for Stderr {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &Record<'_>) {
        let mut fields = Fields(String::new());
        let _ = record.key_values().visit(&mut fields);
        let level = match record.level() {
            Level::Error => "error",
            Level::Warn => "warning",
            Level::Info => "info",
            Level::Debug => "debug",
            Level::Trace => "trace",
        };
        // A library's line says whose it is.
        let target = record.target();
        let from = if target == "cpupoold" || target.starts_with("cpupoold::") {
            String::new()
        } else {
            format!(" [{target}]")
        };
        // One write per line: stderr is unbuffered, and writing the formatted pieces one by one
        // cost a system call per piece (a CPU list was one per number), and could interleave
        // with another process's lines on a shared stream.
        let line = format!("cpupoold {level}{from}: {}{}\n", record.args(), fields.0);
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libraries_stay_at_warn_unless_the_level_is_trace() {
        let info = Filter { level: LevelFilter::Info };
        assert!(info.enabled("cpupoold", Level::Info));
        assert!(info.enabled("cpupoold::engine", Level::Info));
        assert!(!info.enabled("cpupoold::engine", Level::Debug));
        // What tracing forwards from zbus: events, span lifecycle and span activity.
        for target in ["zbus::connection", "tracing::span", "tracing::span::active", "h2::codec"] {
            assert!(!info.enabled(target, Level::Info), "{target}");
            assert!(!info.enabled(target, Level::Trace), "{target}");
            assert!(info.enabled(target, Level::Warn), "{target}");
        }
        // A crate whose name only starts like ours is not ours.
        assert!(!info.enabled("cpupoold_extra", Level::Info));

        let debug = Filter { level: LevelFilter::Debug };
        assert!(debug.enabled("cpupoold::api", Level::Debug));
        assert!(!debug.enabled("zbus::connection", Level::Debug));

        let trace = Filter { level: LevelFilter::Trace };
        assert!(trace.enabled("cpupoold::api", Level::Trace));
        assert!(trace.enabled("zbus::connection", Level::Trace));
        assert!(trace.enabled("tracing::span::active", Level::Trace));

        let error = Filter { level: LevelFilter::Error };
        assert!(!error.enabled("zbus::connection", Level::Warn));
        assert!(error.enabled("zbus::connection", Level::Error));
    }
}
