//! The guides to the code stay true to the tree: docs/development.md's layout names every
//! directory of `src/` and only paths that exist, and each module map in a `mod.rs` (the
//! engine's, the host's, ...) names every module the file declares.

use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The first fenced block under "## Layout" of docs/development.md.
fn layout_block() -> String {
    let doc = read("docs/development.md");
    let section = &doc[doc.find("## Layout").unwrap_or_else(|| panic!("no Layout section"))..];
    let start = section.find("```\n").unwrap_or_else(|| panic!("no block")) + 4;
    let end = section[start..].find("```").unwrap_or_else(|| panic!("unclosed block"));
    section[start..start + end].to_owned()
}

#[test]
fn the_development_layout_names_every_source_directory_and_only_real_paths() {
    let block = layout_block();
    // The paths it names: each line's first word ending in `/`.
    let named: Vec<&str> =
        block.lines().filter_map(|l| l.split_whitespace().next()).filter(|w| w.ends_with('/')).collect();
    assert!(named.len() >= 10, "{named:?}");
    for path in &named {
        assert!(root().join(path).is_dir(), "docs/development.md names `{path}`, which does not exist");
    }
    let mut dirs: Vec<String> = std::fs::read_dir(root().join("src"))
        .unwrap_or_else(|e| panic!("src: {e}"))
        .filter_map(Result::ok)
        .filter(|e| e.path().is_dir())
        .map(|e| format!("src/{}/", e.file_name().to_string_lossy()))
        .collect();
    dirs.sort();
    for dir in &dirs {
        assert!(named.contains(&dir.as_str()), "docs/development.md's layout does not name `{dir}`");
    }
}

/// `mod NAME;` and `pub mod NAME;` lines of a file (not `#[cfg(test)]` ones).
fn declared_modules(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let l = line.trim();
        let name = l.strip_prefix("pub mod ").or(l.strip_prefix("mod ")).and_then(|r| r.strip_suffix(';'));
        let test_only = i > 0 && lines[i - 1].trim().starts_with("#[cfg(test)]");
        if let Some(name) = name.filter(|_| !test_only && !name.is_some_and(|n| n.ends_with("tests"))) {
            out.push(name.to_owned());
        }
    }
    out
}

#[test]
fn the_engine_module_map_names_every_engine_module() {
    let text = read("src/engine/mod.rs");
    let doc: String = text.lines().filter_map(|l| l.strip_prefix("//!")).collect::<Vec<_>>().join("\n");
    let modules = declared_modules(&text);
    assert!(modules.len() >= 8, "{modules:?}");
    for m in &modules {
        assert!(
            doc.contains(&format!("`{m}`")) || doc.contains(&format!("[`{m}`]")),
            "src/engine/mod.rs declares `{m}` but its module map does not name it"
        );
    }
}
