//! Device-plugin requests with arbitrary device IDs: the bytes are decoded as the kubelet's
//! protobuf `AllocateRequest` and `PreferredAllocationRequest` (as tonic would), and every
//! container request is run through the plugin's decoding against each kind of pool of a fixed
//! 2x4x2 host. A refusal must name a field; an accepted allocation must hold only the pool's
//! CPUs, be applicable to the state (or refused by it with a typed error), and a preferred
//! allocation must be a subset of what was available.
use cpupoold::core::devices;
use cpupoold::kubernetes::deviceplugin::proto::v1beta1;
use cpupoold::config;
use cpupoold::core::pool::Pool;
use cpupoold::core::state::State;
use cpupoold::core::topology::Topology;
use prost::Message;

const CONFIG: &str = "[pools.sys]\nkind = \"reserved\"\ncpus = \"0,8\"\n\
    [pools.cores]\nkind = \"exclusive\"\ncpus = \"1-3,9-11\"\n\
    [pools.threads]\nkind = \"exclusive\"\ncpus = \"4-5,12-13\"\nsmt = \"threads\"\n\
    [pools.web]\nkind = \"shared\"\ncpus = \"6-7,14-15\"\n";

fn main() {
    let topo = Topology::synthetic(2, 4, 2, 2);
    let settings = config::load_str(CONFIG, "config.toml").expect("the fixed config loads");
    let pools: Vec<Pool> = settings.resolve_pools(&topo).expect("the fixed pools resolve");
    let state = State::with_pools(pools.clone());
    afl::fuzz!(|data: &[u8]| {
        if let Ok(req) = v1beta1::AllocateRequest::decode(data) {
            for pool in pools.iter().filter(|p| p.kubelet) {
                for millis in [100, 250] {
                    for c in &req.container_requests {
                        match devices::allocation(pool, &topo, millis, &c.devices_ids) {
                            Err(r) => assert!(!r.field.is_empty(), "a refusal names no field"),
                            Ok(a) => {
                                let mut s = state.clone();
                                if let Ok(out) = s.assign(&topo, &a.spec) {
                                    let made = out.into_inner();
                                    assert!(made.cpus.is_subset(&pool.cpus), "{made:?} outside {}", pool.cpus);
                                    let envs = devices::envs(&made);
                                    assert_eq!(envs.get("CPUPOOL_CPUS"), Some(&made.cpus.to_string()));
                                }
                            }
                        }
                    }
                }
            }
        }
        if let Ok(req) = v1beta1::PreferredAllocationRequest::decode(data) {
            for pool in pools.iter().filter(|p| p.kubelet) {
                for c in &req.container_requests {
                    let got = devices::preferred(
                        pool,
                        &topo,
                        100,
                        &c.available_device_i_ds,
                        &c.must_include_device_i_ds,
                        c.allocation_size,
                    );
                    match got {
                        Err(r) => assert!(!r.field.is_empty(), "a refusal names no field"),
                        Ok(ids) => {
                            assert!(ids.iter().all(|id| c.available_device_i_ds.contains(id)), "{ids:?}");
                            assert!(c.must_include_device_i_ds.iter().all(|id| ids.contains(id)));
                        }
                    }
                }
            }
        }
    });
}
