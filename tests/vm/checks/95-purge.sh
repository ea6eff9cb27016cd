# dpkg --purge stops the service and removes state, runtime files and the conffile.
. "$(dirname "$0")/lib.sh"

check "dpkg --purge cpupoold" dpkg --purge cpupoold
check_output "service gone" '^(inactive|unknown)$' sh -c 'systemctl is-active cpupoold.service; true'
check "/var/lib/cpupoold removed" test ! -e /var/lib/cpupoold
check "/run/cpupoold removed" test ! -e /run/cpupoold
check "config.toml removed" test ! -e /etc/cpupoold/config.toml
check "runtime drop-in removed" test ! -e /etc/cpupoold/config.d/90-cpupoold-runtime.toml
check_output "package gone" '^(not-installed|unknown ok not-installed)?$' \
  sh -c "dpkg-query -W -f='\${Status}\n' cpupoold 2>/dev/null; true"
