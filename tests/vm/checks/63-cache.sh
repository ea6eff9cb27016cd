# Cache classes where the host has no resctrl (QEMU offers no RDT, so the kernel neither
# registers resctrl nor makes /sys/fs/resctrl): a reload that adds [pools.dp.cache] is refused
# with the typed not-supported error naming pools.dp.cache.l3, and the daemon keeps running
# the old configuration, by the same process, with no class in force and no group made. What
# the guest offers goes to $RESULTS/cache.txt.
. "$(dirname "$0")/lib.sh"

OUT=$RESULTS/cache.txt
{
  echo "kernel $(uname -r)"
  ls -d /sys/fs/resctrl 2>&1
  grep -w resctrl /proc/filesystems || echo "resctrl is not in /proc/filesystems"
} >"$OUT" 2>&1

pools() { python3 -m varlink.cli call "$VARLINK/org.cpupool.Manager.ListPools" '{}'; }
classes() { python3 -m varlink.cli call "$VARLINK/org.cpupool.Manager.GetClasses" '{}'; }

vm_pools
check "reload with the test pools" systemctl reload cpupoold.service
before=$(pools)
pid=$(main_pid)

vm_pools '[pools.dp.cache]
l3 = "50%"'
check_fails "systemctl reload exits 1 with a cache class the guest cannot have" 1 'cpupoold.service' \
  systemctl reload cpupoold.service
check_fails "cpupoolctl reload names pools.dp.cache.l3 as not supported" 1 \
  'ConfigRejected: .*pools\.dp\.cache\.l3: not supported on this host: no resctrl' cpupoolctl reload
check_output "the journal names the key and what is missing" \
  'pools\.dp\.cache\.l3: not supported on this host: no resctrl' journalctl -u cpupoold.service --no-pager
check_output "still active" '^active$' systemctl is-active cpupoold.service
check_output "by the same process (no restart)" "^$pid\$" main_pid
after=$(pools)
if [ "$after" = "$before" ]; then
  pass "the old pools keep running"
else
  fail "the old pools keep running"
  printf '%s\n' "$before" "$after" | sed 's/^/    /'
fi
check_output "no class is in force" '"classes": \[\]' classes
check "no resctrl group was made" sh -c '! ls -d /sys/fs/resctrl/cpupool-* 2>/dev/null'

# Leave the configuration as shipped for the checks that follow.
rm -f /etc/cpupoold/config.d/50-vmtest.toml
check "reload without the test drop-in" systemctl reload cpupoold.service
