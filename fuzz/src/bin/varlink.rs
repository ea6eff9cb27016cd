//! The varlink decoder path, as a connection runs it: the byte stream split into NUL-terminated
//! frames, each decoded as a call, the method resolved, the arguments checked against the
//! method's and decoded (reads answered from a fixed snapshot). Every answer, reply or error,
//! must encode as one JSON object and one NUL.
use std::sync::Arc;

use cpupoold::api::varlink::methods::{self, Method, MethodError};
use cpupoold::api::varlink::wire::{Call, FrameReader, Reply};
use cpupoold::config;
use cpupoold::core::state::{AssignSpec, Size, State, Target};
use cpupoold::core::topology::Topology;
use cpupoold::engine::Snapshot;
use serde_json::Value;

const CONFIG: &str = "[pools.sys]\nkind = \"reserved\"\ncpus = \"0,4\"\n\
    [pools.dp]\nkind = \"exclusive\"\ncpus = \"1-2,5-6\"\n[pools.web]\nkind = \"shared\"\ncpus = \"3,7\"\n";

fn snapshot() -> Snapshot {
    let topo = Topology::synthetic(1, 4, 2, 1);
    let settings = config::load_str(CONFIG, "config.toml").expect("the fixed config loads");
    let mut state = State::with_pools(settings.resolve_pools(&topo).expect("the fixed pools resolve"));
    for (pool, target, size) in [("dp", "cgroup:k/a", Size::Cpus(2)), ("web", "pid:42", Size::Millicpus(500))]
    {
        let target = Target::parse(target).expect("fixed target");
        let spec = AssignSpec::new(pool, target, size, None);
        state.assign(&topo, &spec).expect("fixed assignment");
    }
    Snapshot {
        state: Arc::new(state),
        topology: Arc::new(topo),
        state_path: "/var/lib/cpupoold/state.json".into(),
        config_error: None,
        degraded: Vec::new(),
        partitions: Arc::default(),
        backend: "cgroupfs",
    }
}

fn check_encoding(r: &Reply) {
    let bytes = r.encode();
    assert_eq!(bytes.last(), Some(&0));
    assert_eq!(bytes.iter().filter(|b| **b == 0).count(), 1, "a NUL inside a reply");
    let v: Value = serde_json::from_slice(&bytes[..bytes.len() - 1]).expect("a reply is JSON");
    assert!(v.is_object());
}

fn answer(call: &Call, snap: &Snapshot) -> Result<Value, MethodError> {
    use cpupool_wire::varlink::params;
    let method = Method::parse(&call.method)?;
    let p = call.parameters.as_ref();
    match method {
        Method::Assign => methods::decode(p)
            .and_then(methods::assign_spec)
            .map(|s| Value::String(s.target.to_string())),
        Method::Release => methods::decode::<params::Release>(p).map(|r| Value::String(r.id)),
        Method::CreatePool | Method::ResizePool | Method::DeletePool => {
            methods::pool_edit(method, p).map(|e| Value::String(e.name().to_string()))
        }
        Method::Monitor => methods::decode::<params::NoParameters>(p).map(|_| Value::Null),
        m => methods::read(m, p, snap, 0),
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
    let snap = snapshot();
    afl::fuzz!(|data: &[u8]| {
        rt.block_on(async {
            let mut reader = FrameReader::new(data);
            // A connection ends at the first framing error or undecodable call.
            while let Ok(Some(frame)) = reader.next().await {
                let Ok(call) = serde_json::from_slice::<Call>(&frame) else { return };
                let reply = match answer(&call, &snap) {
                    Ok(parameters) => Reply { error: None, parameters, continues: false },
                    Err(e) => {
                        assert!(!e.name.is_empty());
                        Reply { error: Some(e.name), parameters: e.parameters, continues: false }
                    }
                };
                check_encoding(&reply);
            }
        });
    });
}
