//! Man pages generated from the clap definition by clap_mangen, plus the sections clap does
//! not know about: EXIT STATUS (on every page, since every subcommand exits the same way) and
//! EXAMPLES (on cpupoolctl(1)).
//!
//! `cpupoolctl manpage` prints cpupoolctl(1); `cpupoolctl manpage --dir DIR` (hidden, for
//! packaging) writes it and one page per subcommand, named as clap names them
//! (`cpupoolctl-pool-assign.1`).

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::error::Error;

/// EXIT STATUS, in roff.
const EXIT_STATUS: &str = r#".SH "EXIT STATUS"
.TP
\fB0\fR
Success.
.TP
\fB1\fR
The daemon answered with an error. Its name is printed (e.g. \fBNoSuchPool\fR, \fBAccessDenied\fR,
\fBInsufficientCapacity\fR) with what to do about it. Also used for other failures after the
arguments were parsed, such as a reply that is not the protocol.
.TP
\fB2\fR
Usage error: the command line is wrong.
.TP
\fB3\fR
The daemon could not be reached: no socket, nothing listening on it, the daemon not on the bus,
or no reply within \fB\-\-timeout\fR. The message names the address that was tried.
.PP
With \fB\-\-json\fR, errors are printed on standard error as one JSON object
\fB{"error": NAME, "parameters": {...}, "message": TEXT}\fR, with the same exit codes.
"#;

/// EXAMPLES, in roff: the examples of `--help` ([`crate::cli::EXAMPLES`]).
fn examples() -> String {
    let lines: String = crate::cli::EXAMPLES
        .lines()
        .skip(1)
        .map(|l| format!("{}\n", l.trim().replace('\\', "\\\\").replace('-', "\\-")))
        .collect();
    format!(".SH EXAMPLES\n.nf\n{lines}.fi\n{SEE_ALSO}")
}

/// SEE ALSO, in roff.
const SEE_ALSO: &str = r#".SH "SEE ALSO"
\fBcpupoold\fR(8), \fBvarlinkctl\fR(1), \fBbusctl\fR(1)
"#;

/// Renders `cmd`'s page; `root` adds the EXAMPLES of cpupoolctl(1).
pub fn render(cmd: clap::Command, root: bool, w: &mut dyn Write) -> io::Result<()> {
    let has_args = cmd.get_arguments().any(|a| !a.is_hide_set());
    let has_subcommands = cmd.get_subcommands().any(|s| !s.is_hide_set());
    let has_version = cmd.get_version().is_some() || cmd.get_long_version().is_some();
    let man = clap_mangen::Man::new(cmd);
    man.render_title(w)?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    man.render_description_section(w)?;
    if has_args {
        man.render_options_section(w)?;
    }
    if has_subcommands {
        man.render_subcommands_section(w)?;
    }
    // Not render_extra_section: that is --help's plain-text version of these sections.
    w.write_all(EXIT_STATUS.as_bytes())?;
    if root {
        w.write_all(examples().as_bytes())?;
    }
    if has_version {
        man.render_version_section(w)?;
    }
    Ok(())
}

/// Writes the page of `cmd` and of every visible subcommand into `dir`; returns the files.
pub fn write_all(cmd: clap::Command, dir: &Path) -> Result<Vec<PathBuf>, Error> {
    fn walk(cmd: &clap::Command, root: bool, dir: &Path, written: &mut Vec<PathBuf>) -> Result<(), Error> {
        let name = cmd.get_display_name().unwrap_or_else(|| cmd.get_name()).to_owned();
        let path = dir.join(format!("{name}.1"));
        let mut bytes = Vec::new();
        render(cmd.clone(), root, &mut bytes)
            .and_then(|()| std::fs::write(&path, bytes))
            .map_err(|source| Error::Local { what: format!("writing `{}`", path.display()), source })?;
        written.push(path);
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            walk(sub, false, dir, written)?;
        }
        Ok(())
    }
    std::fs::create_dir_all(dir)
        .map_err(|source| Error::Local { what: format!("creating `{}`", dir.display()), source })?;
    // Building names the subcommands (`cpupoolctl-pool-assign`) and adds the global options
    // to each of them.
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let mut written = Vec::new();
    walk(&cmd, true, dir, &mut written)?;
    Ok(written)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::CommandFactory;

    #[test]
    fn the_page_has_every_section() {
        let mut out = Vec::new();
        render(Cli::command(), true, &mut out).unwrap();
        let page = String::from_utf8(out).unwrap();
        for needle in [
            ".TH cpupoolctl 1",
            ".SH NAME",
            ".SH SYNOPSIS",
            ".SH OPTIONS",
            "varlink\\-address",
            ".SH SUBCOMMANDS",
            ".SH \"EXIT STATUS\"",
            "\\fB3\\fR",
            ".SH EXAMPLES",
        ] {
            assert!(page.contains(needle), "{needle} missing:\n{page}");
        }
        // The plain-text exit codes of --help are not repeated.
        assert!(!page.contains("Exit status:"), "{page}");
    }

    #[test]
    fn a_page_per_subcommand() {
        let dir = tempfile::tempdir().unwrap();
        let written = write_all(Cli::command(), dir.path()).unwrap();
        let names: Vec<String> =
            written.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        for n in ["cpupoolctl.1", "cpupoolctl-pool.1", "cpupoolctl-pool-assign.1", "cpupoolctl-monitor.1"] {
            assert!(names.iter().any(|x| x == n), "{n} not in {names:?}");
        }
        let assign = std::fs::read_to_string(dir.path().join("cpupoolctl-pool-assign.1")).unwrap();
        assert!(assign.contains("millicpus") && assign.contains("EXIT STATUS"), "{assign}");
        assert!(!assign.contains(".SH EXAMPLES"));
    }
}
