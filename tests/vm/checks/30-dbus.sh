# The D-Bus API on the system bus: name org.cpupool.Manager1, policy from the package.
. "$(dirname "$0")/lib.sh"

check_output "busctl introspect org.cpupool.Manager1 (root)" '^org\.cpupool\.Manager1 +interface' \
  busctl --system introspect org.cpupool.Manager1 /org/cpupool/Manager1
check_output "busctl introspect as nobody (policy allows reading)" 'ListPools' \
  runuser -u nobody -- busctl --system introspect org.cpupool.Manager1 /org/cpupool/Manager1
check_output "busctl call ListPools" 'reserved' \
  busctl --system call org.cpupool.Manager1 /org/cpupool/Manager1 org.cpupool.Manager1 ListPools
