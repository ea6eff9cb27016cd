# Pools created at run time are persisted by the daemon in
# /etc/cpupoold/config.d/90-cpupoold-runtime.toml: the unit's hardening must allow that.
. "$(dirname "$0")/lib.sh"

check_output "varlink CreatePool vmrt" '"vmrt"' python3 -m varlink.cli call \
  "$VARLINK/org.cpupool.Manager.CreatePool" '{"name": "vmrt", "kind": "shared", "cpus": "2"}'
check_output "runtime drop-in written" 'vmrt' cat /etc/cpupoold/config.d/90-cpupoold-runtime.toml
check "varlink DeletePool vmrt" python3 -m varlink.cli call \
  "$VARLINK/org.cpupool.Manager.DeletePool" '{"name": "vmrt"}'
