//! Logging: to the journal with structured fields when our stderr is connected to it
//! (`JOURNAL_STREAM`), otherwise human lines on stderr with the fields appended.

use std::io::Write;

use log::kv::{Key, Value, VisitSource};

/// Installs the logger. Returns whether the journal is used.
pub fn init(level: log::LevelFilter) -> bool {
    log::set_max_level(level);
    if systemd_journal_logger::connected_to_journal() {
        if let Ok(j) = systemd_journal_logger::JournalLog::new() {
            let j = j
                .with_extra_fields(vec![("CPUPOOLD_VERSION", env!("CARGO_PKG_VERSION"))])
                .with_syslog_identifier("cpupoold".to_owned());
            if j.install().is_ok() {
                return true;
            }
        }
    }
    let _ = log::set_boxed_logger(Box::new(Stderr));
    false
}

struct Stderr;

struct Fields(String);

impl<'kvs> VisitSource<'kvs> for Fields {
    fn visit_pair(&mut self, key: Key<'kvs>, value: Value<'kvs>) -> Result<(), log::kv::Error> {
        self.0.push_str(&format!(" {key}={value}"));
        Ok(())
    }
}

impl log::Log for Stderr {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let mut fields = Fields(String::new());
        let _ = record.key_values().visit(&mut fields);
        let level = match record.level() {
            log::Level::Error => "error",
            log::Level::Warn => "warning",
            log::Level::Info => "info",
            log::Level::Debug => "debug",
            log::Level::Trace => "trace",
        };
        let _ = writeln!(std::io::stderr().lock(), "cpupoold {level}: {}{}", record.args(), fields.0);
    }

    fn flush(&self) {}
}
