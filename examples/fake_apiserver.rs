//! The project's fake Kubernetes API server (`tests/fake_apiserver/`, the same code the
//! cluster-integration tests use) as a program, for the guest checks: there is no API server
//! in any registry, so the DRA check in the guest (real containerd, runc, systemd and kernel)
//! reads its ResourceClaims from this fake.
//!
//! ```text
//! fake_apiserver KUBECONFIG
//!     Serves on 127.0.0.1 (a port of its own), writes KUBECONFIG pointing at it, prints
//!     `serving PORT`, then reads commands from stdin, one per line, answering each with one
//!     line on stdout:
//!       put COLLECTION JSON       create or replace an object (as a controller would)  -> ok
//!       put-claim JSON            create or replace a ResourceClaim (with its status, as the
//!                                 scheduler leaves it allocated and reserved)          -> ok
//!       delete COLLECTION NAME                                                         -> ok
//!       get COLLECTION NAME       the object as stored, or null
//!       slices NODE               the node's ResourceSlices, as a JSON list
//!       count METHOD PATH-PART    how many requests so far had METHOD and a path containing PATH-PART
//!     It ends at the end of its input.
//! ```
//!
//! A fake in place of the API server only; every other part of those checks is real.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/fake_apiserver/mod.rs"]
mod fake_apiserver;

use std::io::{BufRead, Write};
use std::path::Path;

use serde_json::Value;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [kubeconfig] = args.as_slice() else {
        return Err("usage: fake_apiserver KUBECONFIG (commands on stdin)".into());
    };
    let fake = fake_apiserver::Fake::start();
    fake.write_kubeconfig(Path::new(kubeconfig));
    let mut out = std::io::stdout().lock();
    writeln!(out, "serving {}", fake.port)?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let mut words = line.splitn(3, ' ');
        let answer = match (words.next(), words.next(), words.next()) {
            (Some("put"), Some(collection), Some(json)) => match serde_json::from_str::<Value>(json) {
                Ok(obj) if obj["metadata"]["name"].is_string() => {
                    fake.put(collection, obj);
                    "ok".to_owned()
                }
                Ok(_) => "error: the object has no metadata.name".to_owned(),
                Err(e) => format!("error: {e}"),
            },
            (Some("put-claim"), Some(first), rest) => {
                let json = rest.map_or_else(|| first.to_owned(), |r| format!("{first} {r}"));
                match serde_json::from_str::<Value>(&json) {
                    Ok(obj)
                        if obj["metadata"]["namespace"].is_string()
                            && obj["metadata"]["name"].is_string() =>
                    {
                        fake.put_claim(obj);
                        "ok".to_owned()
                    }
                    Ok(_) => "error: the claim has no metadata.namespace and name".to_owned(),
                    Err(e) => format!("error: {e}"),
                }
            }
            (Some("delete"), Some(collection), Some(name)) => {
                fake.delete(collection, name);
                "ok".to_owned()
            }
            (Some("get"), Some(collection), Some(name)) => {
                fake.object(collection, name).map_or_else(|| "null".to_owned(), |o| o.to_string())
            }
            (Some("slices"), Some(node), None) => {
                serde_json::to_string(&fake.slices(node)).unwrap_or_else(|e| format!("error: {e}"))
            }
            (Some("count"), Some(method), Some(part)) => {
                fake.count(|r| r.method == method && r.path.contains(part)).to_string()
            }
            (Some(""), None, None) => continue,
            _ => format!("error: unknown command `{line}`"),
        };
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    Ok(())
}
