//! `packaging/cpupoold.toml.5`, the configuration's man page, against the parser.
//!
//! The keys the parser accepts are not listed here a second time: they are read off the
//! fragment types themselves, by deserializing a [`Fragment`] from a deserializer that records
//! every field serde asks for ([`Recorder`]). The keys the man page documents are read off its
//! `.TP` tags (`\fBkey =\fR \fItype\fR` under a `.SH "[table] SECTION"` heading), and each is
//! parsed, with a value of its documented type, by the real stage-1 parser.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::de::value::{Error as DeError, SeqDeserializer, StrDeserializer};
use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, Visitor};
use serde::Deserialize;

use super::fragments::{parse, Fragment};

fn manpage_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/cpupoold.toml.5")
}

fn manpage() -> String {
    let path = manpage_path();
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// What the recorder saw: every leaf key (`daemon.log_level`; map keys are `*`, so
/// `pools.*.kind`) and the variants of every enum-typed key.
#[derive(Default)]
struct Seen {
    keys: BTreeSet<String>,
    variants: BTreeMap<String, Vec<&'static str>>,
}

/// A serde deserializer that offers every field a struct asks for, one entry `*` for every
/// map, and a plain value for every leaf, recording the path of each leaf on the way.
struct Recorder<'a> {
    path: String,
    seen: &'a RefCell<Seen>,
}

impl<'a> Recorder<'a> {
    fn child(&self, name: &str) -> Recorder<'a> {
        let path = if self.path.is_empty() { name.to_owned() } else { format!("{}.{name}", self.path) };
        Recorder { path, seen: self.seen }
    }

    fn leaf(&self) {
        self.seen.borrow_mut().keys.insert(self.path.clone());
    }
}

/// The entries offered to a struct (its fields) or a map (one key, `*`).
struct Entries<'a> {
    parent: Recorder<'a>,
    names: Vec<&'static str>,
    next: usize,
}

impl<'de> MapAccess<'de> for Entries<'_> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, DeError> {
        let Some(name) = self.names.get(self.next) else { return Ok(None) };
        let key: StrDeserializer<'_, DeError> = name.into_deserializer();
        seed.deserialize(key).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let name = self.names[self.next];
        self.next += 1;
        seed.deserialize(self.parent.child(name))
    }
}

macro_rules! leaf {
    ($($method:ident => |$v:ident| $value:expr;)*) => {$(
        fn $method<V: Visitor<'de>>(self, $v: V) -> Result<V::Value, DeError> {
            self.leaf();
            $value
        }
    )*};
}

impl<'de> de::Deserializer<'de> for Recorder<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, DeError> {
        // A self-describing field (an untagged enum, a custom Deserialize) would need the
        // recorder taught its shape; say which one rather than guess.
        Err(de::Error::custom(format!(
            "`{}` asks for deserialize_any: teach the recorder its type",
            self.path
        )))
    }

    leaf! {
        deserialize_bool => |v| v.visit_bool(true);
        deserialize_i8 => |v| v.visit_i64(1);
        deserialize_i16 => |v| v.visit_i64(1);
        deserialize_i32 => |v| v.visit_i64(1);
        deserialize_i64 => |v| v.visit_i64(1);
        deserialize_u8 => |v| v.visit_u64(1);
        deserialize_u16 => |v| v.visit_u64(1);
        deserialize_u32 => |v| v.visit_u64(1);
        deserialize_u64 => |v| v.visit_u64(1);
        deserialize_f32 => |v| v.visit_f64(1.0);
        deserialize_f64 => |v| v.visit_f64(1.0);
        deserialize_char => |v| v.visit_char('x');
        deserialize_str => |v| v.visit_str("x");
        deserialize_string => |v| v.visit_str("x");
        deserialize_bytes => |v| v.visit_bytes(b"x");
        deserialize_byte_buf => |v| v.visit_bytes(b"x");
        deserialize_unit => |v| v.visit_unit();
        deserialize_seq => |v| v.visit_seq(SeqDeserializer::<_, DeError>::new(std::iter::empty::<u8>()));
        deserialize_identifier => |v| v.visit_str("x");
        deserialize_ignored_any => |v| v.visit_unit();
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        v.visit_some(self)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, _: &'static str, v: V) -> Result<V::Value, DeError> {
        self.leaf();
        v.visit_unit()
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, v: V) -> Result<V::Value, DeError> {
        v.visit_newtype_struct(self)
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, v: V) -> Result<V::Value, DeError> {
        self.deserialize_seq(v)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: usize,
        v: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_seq(v)
    }

    fn deserialize_map<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        v.visit_map(Entries { parent: self, names: vec!["*"], next: 0 })
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, DeError> {
        v.visit_map(Entries { parent: self, names: fields.to_vec(), next: 0 })
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, DeError> {
        self.leaf();
        self.seen.borrow_mut().variants.insert(self.path.clone(), variants.to_vec());
        let first: StrDeserializer<'_, DeError> = variants
            .first()
            .ok_or_else(|| de::Error::custom(format!("`{}` is an enum without variants", self.path)))?
            .into_deserializer();
        v.visit_enum(first)
    }
}

/// Every key the parser accepts, and the variants of its enum-typed keys.
fn accepted() -> Seen {
    let seen = RefCell::new(Seen::default());
    Fragment::deserialize(Recorder { path: String::new(), seen: &seen })
        .unwrap_or_else(|e| panic!("recording the fragment's fields: {e}"));
    seen.into_inner()
}

/// One key as the man page documents it.
#[derive(Debug)]
struct Documented {
    /// `daemon.log_level`, `pools.*.kind`.
    key: String,
    /// The table as a TOML header names it (`pools.NAME` becomes `pools.x`).
    table: String,
    name: String,
    /// `\fItype\fR`, e.g. `path`; `None` for an enumeration.
    ty: Option<String>,
    /// The quoted values of an enumeration (`"auto" | "systemd"`).
    values: Vec<String>,
}

/// Roff to text: fonts dropped, `\-` and `\&` undone.
fn unroff(s: &str) -> String {
    s.replace("\\fB", "").replace("\\fI", "").replace("\\fR", "").replace("\\-", "-").replace("\\&", "")
}

/// The keys of the man page: each `.TP` tag `\fBKEY =\fR ...` under `.SH "[TABLE] SECTION(S)"`.
fn documented(page: &str) -> Vec<Documented> {
    let mut out = Vec::new();
    let mut table: Option<String> = None;
    let mut lines = page.lines().peekable();
    while let Some(line) = lines.next() {
        if let Some(heading) = line.strip_prefix(".SH ") {
            let heading = unroff(heading.trim_matches('"'));
            table = heading
                .strip_prefix('[')
                .and_then(|h| h.split_once(']'))
                .filter(|(_, rest)| rest.trim().starts_with("SECTION"))
                .map(|(t, _)| t.to_owned());
            continue;
        }
        let (Some(table), ".TP") = (&table, line) else { continue };
        let Some(tag) = lines.peek() else { break };
        let Some((name, rest)) = tag.strip_prefix("\\fB").and_then(|t| t.split_once(" =\\fR ")) else {
            panic!("in [{table}]: a .TP tag that is not `\\fBKEY =\\fR TYPE`: {tag}")
        };
        let name = unroff(name);
        let ty = rest.strip_prefix("\\fI").and_then(|r| r.split_once("\\fR")).map(|(t, _)| t.to_owned());
        let values = if ty.is_some() {
            Vec::new()
        } else {
            unroff(rest).split('|').map(|v| v.trim().trim_matches('"').to_owned()).collect()
        };
        // `pools.NAME` and the tables below it (`pools.NAME.cache`, `pools.NAME.power`): NAME is
        // any pool.
        let key_table = table.replacen("pools.NAME", "pools.*", 1);
        out.push(Documented {
            key: format!("{key_table}.{name}"),
            table: table.replacen("pools.NAME", "pools.x", 1),
            name,
            ty,
            values,
        });
    }
    out
}

/// A TOML value of a documented type.
fn sample(d: &Documented) -> String {
    match d.ty.as_deref() {
        Some("path") => "\"/x\"".into(),
        Some("string") => "\"x\"".into(),
        Some("CPU list") => "\"0-1\"".into(),
        Some("boolean") => "true".into(),
        Some("integer") => "1".into(),
        Some("list of strings") => "[\"x\"]".into(),
        Some("frequency") => "\"max\"".into(),
        Some(other) => panic!("{}: the man page's type `{other}` is not one this test knows", d.key),
        None => format!("\"{}\"", d.values[0]),
    }
}

#[test]
fn man_page_documents_exactly_the_keys_the_parser_accepts() {
    let page = manpage();
    let docs = documented(&page);
    let accepted = accepted();
    assert!(accepted.keys.len() >= 30, "the recorder saw too few keys: {:?}", accepted.keys);
    let documented: BTreeSet<String> = docs.iter().map(|d| d.key.clone()).collect();
    assert_eq!(documented.len(), docs.len(), "a key is documented twice: {docs:#?}");

    let missing: Vec<_> = accepted.keys.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&accepted.keys).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{}: keys the parser accepts but the page does not document: {missing:?}; keys the page documents \
         but the parser does not accept: {extra:?}",
        manpage_path().display()
    );

    // Each documented key, with a value of its documented type (every value of an
    // enumeration), goes through the real parser.
    for d in &docs {
        let values: Vec<String> = if d.ty.is_some() {
            vec![sample(d)]
        } else {
            d.values.iter().map(|v| format!("\"{v}\"")).collect()
        };
        for value in values {
            let text = format!("[{}]\n{} = {value}\n", d.table, d.name);
            parse(&text, Path::new("cpupoold.toml.5"))
                .unwrap_or_else(|e| panic!("the man page's `{}` as `{value}` does not parse: {e}", d.key));
        }
    }

    // Enum-typed keys: the page lists exactly the variants the type has.
    for (key, variants) in &accepted.variants {
        let d = docs.iter().find(|d| &d.key == key).unwrap_or_else(|| panic!("{key} is not documented"));
        assert_eq!(d.values, *variants, "{key}: the values the page lists, and the type's variants");
    }
}

/// A documented key the parser rejects, and an accepted key the page leaves out, are both
/// caught: the check above is not vacuous.
#[test]
fn man_page_check_catches_a_key_too_many_and_a_key_too_few() {
    let page = manpage();
    let tag = "\\fBlend_idle =\\fR \\fIboolean\\fR";
    assert!(page.contains(tag));
    let renamed = page.replace(tag, "\\fBlend_idel =\\fR \\fIboolean\\fR");
    let docs: BTreeSet<String> = documented(&renamed).into_iter().map(|d| d.key).collect();
    let accepted = accepted().keys;
    assert!(accepted.contains("daemon.lend_idle") && !docs.contains("daemon.lend_idle"));
    assert!(docs.contains("daemon.lend_idel") && !accepted.contains("daemon.lend_idel"));
    assert!(parse("[daemon]\nlend_idel = true\n", Path::new("x.toml")).is_err());
}

/// The EXAMPLES section's blocks, read in order as the main file and its drop-ins, load.
#[test]
fn man_page_examples_load() {
    let page = manpage();
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in page.lines() {
        match (line, &mut current) {
            (".EX", None) => current = Some(String::new()),
            (".EE", Some(_)) => blocks.extend(current.take()),
            (l, Some(b)) => {
                b.push_str(&unroff(l));
                b.push('\n');
            }
            _ => {}
        }
    }
    assert!(blocks.len() >= 2, "{blocks:?}");
    let names: Vec<String> = (0..blocks.len()).map(|i| format!("example-{i}.toml")).collect();
    let fragments: Vec<(&str, &str)> =
        names.iter().map(String::as_str).zip(blocks.iter().map(String::as_str)).collect();
    let settings = super::load_strs(&fragments).unwrap_or_else(|e| panic!("the man page's examples: {e}"));
    assert_eq!(settings.pools.len(), 3);
}

/// groff's own warnings (`-ww`) on the page; skipped, saying why, without groff.
#[test]
fn man_page_lints_clean() {
    let out = match Command::new("groff").args(["-man", "-ww", "-z"]).arg(manpage_path()).output() {
        Ok(out) => out,
        Err(e) => {
            eprintln!("SKIPPED: groff is not available ({e}); apt-get install groff to lint the man page");
            return;
        }
    };
    let warnings = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && warnings.trim().is_empty(), "groff -man -ww -z:\n{warnings}");
}
