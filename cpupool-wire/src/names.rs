//! The names clients depend on (ARCHITECTURE.md, "Names we have settled").

/// The D-Bus well-known name.
pub const DBUS_NAME: &str = "org.cpupool.Manager1";
/// The D-Bus object.
pub const DBUS_OBJECT: &str = "/org/cpupool/Manager1";
/// The D-Bus interface.
pub const DBUS_INTERFACE: &str = "org.cpupool.Manager1";
/// The prefix of every D-Bus error name of the interface (`<prefix>.<kind>`).
pub const DBUS_ERROR_PREFIX: &str = "org.cpupool.Manager1.Error";

/// The varlink interface; also the socket's file name.
pub const VARLINK_INTERFACE: &str = "org.cpupool.Manager";
/// The standard service interface every varlink service implements.
pub const VARLINK_SERVICE: &str = "org.varlink.service";
/// The daemon's runtime directory.
pub const RUNTIME_DIR: &str = "/run/cpupoold";
/// The varlink socket's file name, in the runtime directory.
pub const VARLINK_SOCKET_NAME: &str = VARLINK_INTERFACE;
/// The varlink socket of the packaged daemon.
pub const VARLINK_SOCKET: &str = "/run/cpupoold/org.cpupool.Manager";

/// Set in containers given CPUs by the kubelet: the CPU list granted.
pub const ENV_CPUS: &str = "CPUPOOL_CPUS";
/// Set in containers given CPUs by the kubelet: the pool's name.
pub const ENV_POOL: &str = "CPUPOOL_POOL";
/// The CPU list again, for workloads that read it under this name (exclusive pools).
pub const ENV_EXCLUSIVE_CPUS: &str = "EXCLUSIVE_CPUS";
/// The CPU list again, for workloads that read it under this name (shared pools).
pub const ENV_SHARED_CPUS: &str = "SHARED_CPUS";
/// The assignment's id: set by `cpupoolctl run`, and by `Allocate` (for the workload to read;
/// the NRI plugin takes the kubelet's word on what a container holds, not its environment).
pub const ENV_ASSIGNMENT: &str = "CPUPOOL_ASSIGNMENT";
/// The DRA claim whose CPUs a container runs on (its uid), set by the claim's CDI spec.
pub const ENV_CLAIM: &str = "CPUPOOL_CLAIM";
/// A shared pool's assignment size in millicpus (set by `Allocate`).
pub const ENV_MILLICPUS: &str = "CPUPOOL_MILLICPUS";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_is_the_interface_in_the_runtime_dir() {
        assert_eq!(VARLINK_SOCKET, format!("{RUNTIME_DIR}/{VARLINK_SOCKET_NAME}"));
        assert_eq!(DBUS_ERROR_PREFIX, format!("{DBUS_INTERFACE}.Error"));
    }
}
