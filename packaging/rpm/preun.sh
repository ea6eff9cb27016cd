# cpupoold %preun ($1: 0 on erase, 1 on upgrade): on erase stop and disable the service.
if [ "$1" -eq 0 ]; then
  systemctl --no-reload disable --now cpupoold.service >/dev/null 2>&1 || :
fi
