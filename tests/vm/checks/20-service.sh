# Start the service with the shipped default configuration; Type=notify means `active` only
# after READY=1. Then look at the hardening from inside its mount namespace.
. "$(dirname "$0")/lib.sh"

check "systemctl enable --now cpupoold" systemctl enable --now cpupoold.service
check_output "is-active is active (READY=1 reached)" '^active$' systemctl is-active cpupoold.service
check_output "STATUS= set" 'StatusText=.+' systemctl show -p StatusText cpupoold.service
check "varlink socket exists" test -S /run/cpupoold/org.cpupool.Manager
pid=$(main_pid)
check "main pid known" test "$pid" -gt 0
# LimitNOFILE= reaches the daemon, which runs on the whole of it and says what it has.
check_output "the unit's LimitNOFILE is 65536" '^LimitNOFILE=65536$' systemctl show -p LimitNOFILE cpupoold.service
check_output "the daemon's soft descriptor limit is 65536" '^Max open files +65536 +65536' grep '^Max open files' "/proc/$pid/limits"
check_output "and its log says so" 'descriptors: soft RLIMIT_NOFILE .*65536' journalctl -u cpupoold --no-pager -o cat
ns() { nsenter -t "$pid" -m -- "$@"; }
check "unit can write /etc/cpupoold/config.d (ConfigurationDirectory=)" \
  ns sh -c 'touch /etc/cpupoold/config.d/.vmtest && rm /etc/cpupoold/config.d/.vmtest'
check "unit can write /var/lib/cpupoold (StateDirectory=)" \
  ns sh -c 'touch /var/lib/cpupoold/.vmtest && rm /var/lib/cpupoold/.vmtest'
check "unit can write /sys/fs/cgroup (ReadWritePaths=)" ns test -w /sys/fs/cgroup/cgroup.subtree_control
check "unit cannot write /usr (ProtectSystem=strict)" sh -c '! nsenter -t '"$pid"' -m -- touch /usr/.vmtest'
check "unit cannot write /etc outside /etc/cpupoold" sh -c '! nsenter -t '"$pid"' -m -- touch /etc/.vmtest'
check "unit sees no /root (ProtectHome=)" sh -c '! nsenter -t '"$pid"' -m -- touch /root/.vmtest'
check_output "state file written" 'state.json' ls /var/lib/cpupoold
