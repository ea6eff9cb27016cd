# systemd's own varlink client, varlinkctl (systemd 257 in Debian 13), against the packaged
# daemon: the client an operator reaches for first. Its IDL parser is systemd's, not ours or
# the PyPI package's, so `introspect` and `validate-idl` check the interface text against a
# second implementation. Reads only; the one write is refused (nobody may not assign).
. "$(dirname "$0")/lib.sh"

A=/run/cpupoold/org.cpupool.Manager
I=org.cpupool.Manager

check_output "varlinkctl is systemd's, 254 or later" '^systemd (25[4-9]|2[6-9][0-9]|[3-9][0-9]{2})' \
  varlinkctl --version
check_output "info names the product and the interface" "^ *Interfaces: $I\$" varlinkctl info $A
check_output "info: the product" '^ *Product: cpupoold$' varlinkctl info $A
check_output "list-interfaces" "^$I\$" varlinkctl list-interfaces $A
check_output "list-methods names Monitor" "^$I\\.Monitor\$" varlinkctl list-methods $A $I
check_output "introspect: systemd parses the interface the daemon serves" '^method ListPools\(\)' \
  varlinkctl introspect $A $I
check_output "validate-idl: the installed IDL is valid to systemd" '' \
  varlinkctl validate-idl /usr/share/varlink/$I.varlink
check_output "call ListPools" '"name" *: *"reserved"' varlinkctl call $A $I.ListPools '{}'
check_output "call Status (--json=short: one line)" '^\{"assignments":[0-9]+,.*"version":"' \
  varlinkctl call --json=short $A $I.Status '{}'
check_output "call as nobody: reads are open" '"name" *: *"reserved"' \
  runuser -u nobody -- varlinkctl call $A $I.ListPools '{}'
check_fails "a method error exits 1 and is named" 1 "failed: $I\\.NoSuchPool" \
  varlinkctl call $A $I.GetPool '{"name": "nosuch"}'
check_fails "an Assign as nobody is refused with AccessDenied" 1 "failed: $I\\.AccessDenied" \
  runuser -u nobody -- varlinkctl call $A $I.Assign '{"pool": "reserved", "target": "pid:1", "cpus": 1}'

# --more: Monitor streams; its first replies replay each pool as "current". The stream does
# not end, so the client is stopped after the first reply (head closes the pipe; with one pool
# nothing more is written, and timeout ends it). varlinkctl writes the replies of --more as
# JSON text sequences (RFC 7464): each starts with an RS byte, hence no ^ in the pattern.
monitor_first() {
  timeout 5 varlinkctl call --more --json=short $A $I.Monitor '{}' | head -n 1
}
check_output "--more Monitor: the first reply replays a pool as current" \
  '\{"event":\{"change":"current","kind":"pool","pool":"[a-z]' monitor_first
