# cpupoold %post ($1: 1 on first installation, 2 on upgrade). Same policy as the .deb: enable
# on first installation without starting; upgrades restart a running service in %postun.

# Make the system bus re-read its policy (org.cpupool.Manager1.conf); dbus-daemon would also
# notice the file by itself, dbus-broker would not.
reload_bus_policy() {
  if [ -S /run/dbus/system_bus_socket ] && command -v busctl >/dev/null 2>&1; then
    busctl call org.freedesktop.DBus /org/freedesktop/DBus org.freedesktop.DBus ReloadConfig \
      >/dev/null 2>&1 || :
  fi
}

if command -v systemd-sysusers >/dev/null 2>&1; then
  systemd-sysusers cpupoold.conf || :
elif ! getent group cpupool >/dev/null; then
  groupadd -r cpupool || :
fi
if command -v systemd-tmpfiles >/dev/null 2>&1; then
  systemd-tmpfiles --create cpupoold.conf || :
fi
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload || :
  reload_bus_policy
fi
if [ "$1" -eq 1 ]; then
  systemctl --no-reload enable cpupoold.service >/dev/null 2>&1 || :
fi
