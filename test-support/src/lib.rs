//! What the tests of cpupoold and cpupoolctl share, so that each is written once:
//!
//! - [`apiserver`]: inputs as an API server makes them: random version-4 UUIDs (digit-first
//!   ones included), names at the API's maxima;
//! - [`daemon`]: the real `cpupoold` binary started on a sandbox host, its banner read up to
//!   `READY` (never a sleep), and stopped with SIGTERM and a checked exit;
//! - [`files`]: a sandbox's configuration, directories, permissions for other uids;
//! - [`needs`]: what a test needs from the machine (a command, a Python module, root): a missing
//!   one fails the test with what to install, never an `ok` for a check not made;
//! - [`peer`]: the unprivileged varlink peer of the connection-limit tests;
//! - [`uid`]: containerd's container ids;
//! - [`wait`]: polling a condition against a deadline, for what has no ready signal (a log
//!   line, a file the daemon writes);
//! - `kubelet` (feature `kubelet`): a kubelet-shaped peer speaking the real protobuf: the
//!   `v1beta1.Registration` socket, `v1.PodResourcesLister` and the CRI `RuntimeService`;
//! - `dra` (feature `kubelet`): the kubelet's plugin watcher and DRA client: registration
//!   through `plugins_registry/`, then `v1.DRAPlugin` calls on the endpoint it names;
//! - `nri` (feature `kubelet`): a fake container runtime's end of NRI (its multiplexer and
//!   ttRPC written here, apart from the daemon's), for what the guest's real containerd does not
//!   make easy to provoke.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod apiserver;
pub mod daemon;
#[cfg(feature = "kubelet")]
pub mod dra;
pub mod files;
#[cfg(feature = "kubelet")]
pub mod kubelet;
pub mod needs;
#[cfg(feature = "kubelet")]
pub mod nri;
pub mod peer;
pub mod uid;
pub mod wait;
