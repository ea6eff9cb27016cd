# apt-get remove keeps the configuration; installing again keeps the admin's edits.
. "$(dirname "$0")/lib.sh"

echo '# edited by the vm test' >>/etc/cpupoold/config.toml
check "apt-get remove cpupoold" apt-get remove -y -q cpupoold
check_output "service stopped" '^(inactive|unknown)$' sh -c 'systemctl is-active cpupoold.service; true'
check "binary removed" test ! -e /usr/bin/cpupoold
check_output "package in config-files state" '^deinstall ok config-files$' \
  dpkg-query -W -f='${Status}\n' cpupoold
check_output "edited config.toml kept after remove" 'edited by the vm test' cat /etc/cpupoold/config.toml
check "state kept after remove" test -d /var/lib/cpupoold
check "dpkg -i again" dpkg -i "$DEB"
check_output "edited config.toml kept after reinstall" 'edited by the vm test' cat /etc/cpupoold/config.toml
check_output "enabled again after reinstall" '^enabled$' systemctl is-enabled cpupoold.service
check "start again" systemctl start cpupoold.service
check_output "active again" '^active$' systemctl is-active cpupoold.service
