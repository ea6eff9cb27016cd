# Install the freshly built package; it enables the service but does not start it.
. "$(dirname "$0")/lib.sh"

check "package found on the share" test -f "$DEB"
check "dpkg -i $(basename "$DEB")" dpkg -i "$DEB"
check_output "package installed" '^install ok installed$' dpkg-query -W -f='${Status}\n' cpupoold
for f in /usr/bin/cpupoold /usr/bin/cpupoolctl /usr/lib/systemd/system/cpupoold.service \
  /usr/share/dbus-1/system.d/org.cpupool.Manager1.conf \
  /usr/share/dbus-1/interfaces/org.cpupool.Manager1.xml \
  /usr/share/varlink/org.cpupool.Manager.varlink /etc/cpupoold/config.toml \
  /usr/lib/tmpfiles.d/cpupoold.conf /usr/lib/sysusers.d/cpupoold.conf \
  /usr/share/man/man1/cpupoolctl.1.gz /usr/share/man/man8/cpupoold.8.gz \
  /usr/share/bash-completion/completions/cpupoolctl; do
  check "installed $f" test -e "$f"
done
check_output "config.toml is a conffile" '/etc/cpupoold/config.toml' \
  dpkg-query -W -f='${Conffiles}\n' cpupoold
check "group cpupool created (sysusers.d)" getent group cpupool
check "/etc/cpupoold/config.d created (tmpfiles.d)" test -d /etc/cpupoold/config.d
check_output "service enabled on install" '^enabled$' systemctl is-enabled cpupoold.service
check_output "service not started on install" '^inactive$' sh -c 'systemctl is-active cpupoold.service; true'
check_output "cpupoold --version" 'cpupoold [0-9]' cpupoold --version
