# cpupoold %postun ($1: 0 on erase, 1 on upgrade): reload systemd and the bus; on upgrade
# restart the service if it runs. RPM has no purge: /var/lib/cpupoold stays after an erase.

# Make the system bus re-read (or drop) the org.cpupool.Manager1 policy.
reload_bus_policy() {
  if [ -S /run/dbus/system_bus_socket ] && command -v busctl >/dev/null 2>&1; then
    busctl call org.freedesktop.DBus /org/freedesktop/DBus org.freedesktop.DBus ReloadConfig \
      >/dev/null 2>&1 || :
  fi
}

if [ -d /run/systemd/system ]; then
  systemctl daemon-reload || :
  reload_bus_policy
  if [ "$1" -ge 1 ]; then
    systemctl try-restart cpupoold.service >/dev/null 2>&1 || :
  fi
fi
