# The books match the kernel, on real systemd and cgroup v2: a unit outside its pool's slice
# and a cgroup whose parent lacks the pool's CPUs are refused and nothing stays booked; targets
# that would defeat the pools are refused; a drifted assignment is restored by the drift check,
# and one that cannot be restored is reported degraded. 4 CPUs: reserved 0, shared web 1,
# exclusive dp 2-3 isolated.
. "$(dirname "$0")/lib.sh"

CG=/sys/fs/cgroup
DP=$CG/cpupool.slice/cpupool-dp.slice
vm_pools "isolate = true"
# Drift is looked for every 2 s here (10 s by default).
mkdir -p /run/systemd/system/cpupoold.service.d
printf '[Service]\nExecStart=\nExecStart=/usr/bin/cpupoold --check-interval 2\n' \
  >/run/systemd/system/cpupoold.service.d/50-vmtest.conf
systemctl daemon-reload
check "restart with the 4-CPU pools, drift checked every 2 s" systemctl restart cpupoold

# A unit in system.slice (effective CPUs 0) cannot run on dp's CPUs: refused, nothing booked.
systemd-run --quiet --unit=stray.service /bin/sleep infinity
check_fails "a unit in system.slice is refused dp's CPUs" 1 'TargetOutsidePool.*system.slice' \
  cpupoolctl pool assign dp --unit stray.service --cpus 1 --id stray
check_fails "... over D-Bus too" 1 'TargetOutsidePool' \
  cpupoolctl --dbus pool assign dp --unit stray.service --cpus 1 --id stray
check_output "... and told where to start it" 'slice=cpupool-dp.slice' \
  sh -c 'cpupoolctl pool assign dp --unit stray.service --cpus 1 2>&1; true'
check_output "nothing is booked for it" '^no assignments$' cpupoolctl assignments
check_output "dp keeps both CPUs free" 'free cpus: +2-3' cpupoolctl pool show dp
check_output "stray.service keeps its AllowedCPUs" '^AllowedCPUs=$' systemctl show -p AllowedCPUs stray.service
systemctl stop stray.service

# A cgroup below the root, whose effective CPUs lost dp's to the partition: refused.
mkdir -p $CG/work/app
check_fails "a cgroup whose parent lacks dp's CPUs is refused" 1 'TargetOutsidePool' \
  cpupoolctl pool assign dp --cgroup work/app --cpus 1
check "its cpuset.cpus is left alone (absent or empty)" sh -c "[ -z \"\$(cat $CG/work/app/cpuset.cpus 2>/dev/null)\" ]"
check_output "nothing is booked for it" '^no assignments$' cpupoolctl assignments
rmdir $CG/work/app $CG/work

# Targets that would defeat the pools.
check_fails "cpupool-dp.slice itself is refused" 1 'TargetNotAllowed' \
  cpupoolctl pool assign web --cgroup cpupool.slice/cpupool-dp.slice --millicpus 100
check_output "dp's partition stays isolated" '^isolated$' cat $DP/cpuset.cpus.partition
check_fails "system.slice is refused" 1 'TargetNotAllowed' cpupoolctl pool assign web --unit system.slice --millicpus 100
check_fails "init.scope is refused" 1 'TargetNotAllowed' cpupoolctl pool assign web --unit init.scope --millicpus 100

# A cgroup in dp's slice: accepted, and what is read back is what was assigned.
mkdir -p $DP/app
check_output "a cgroup in dp's slice is accepted" 'state: +applied' \
  cpupoolctl pool assign dp --cgroup cpupool.slice/cpupool-dp.slice/app --cpus 1 --id app
cpu=$(cpupoolctl assignments --json | python3 -c 'import json,sys; print([a["cpus"] for a in json.load(sys.stdin)["assignments"] if a["id"]=="app"][0])')
check_output "its cpuset.cpus.effective is $cpu" "^$cpu\$" cat $DP/app/cpuset.cpus.effective
check_fails "a cgroup inside it is refused" 1 'TargetNotAllowed.*lies inside' \
  sh -c "mkdir -p $DP/app/sub && cpupoolctl pool assign dp --cgroup cpupool.slice/cpupool-dp.slice/app/sub --cpus 1"
rmdir $DP/app/sub 2>/dev/null

# Drift: someone rewrites the file; the next check puts it back.
other=$([ "$cpu" = 2 ] && echo 3 || echo 2)
echo "$other" >$DP/app/cpuset.cpus
if wait_for 15 sh -c "[ \"\$(cat $DP/app/cpuset.cpus.effective)\" = $cpu ]"; then
  pass "a rewritten cpuset.cpus is restored by the drift check"
else
  fail "cpuset.cpus of app stayed $(cat $DP/app/cpuset.cpus)"
fi
# Logged when the check ends, which may be after the file was seen restored.
check "the correction is logged" wait_for 15 sh -c \
  "journalctl -b -u cpupoold --no-pager -o cat | grep -Eq 'drift check: [1-9][0-9]* corrections'"
check_output "and the assignment is applied" 'app +dp +'"$cpu"' +1000m +applied' cpupoolctl assignments

# A unit in dp's slice moved out of it behind cpupoold's back cannot be corrected (its new
# slice has CPU 0 only): degraded, shown everywhere, restored when it comes back.
# drifter_in SLICE: (re)writes drifter.service to run in SLICE and reloads systemd.
drifter_in() {
  printf '[Service]\nSlice=%s\nExecStart=/bin/sleep infinity\n' "$1" >/run/systemd/system/drifter.service
  systemctl daemon-reload
}
drifter_in cpupool-dp.slice
systemctl start drifter.service
# --no-reclaim: the restarts below must not release it.
check "assign dp to drifter.service" cpupoolctl pool assign dp --unit drifter.service --cpus 1 --id drifter --no-reclaim
cpupoolctl monitor >/tmp/monitor.log 2>&1 &
mon=$!
drifter_in system.slice
systemctl restart drifter.service
if wait_for 15 sh -c 'cpupoolctl assignments | grep -Eq "drifter +dp .* degraded"'; then
  pass "a unit moved out of its pool's slice is reported degraded"
else
  fail "drifter was never degraded"; cpupoolctl assignments | sed 's/^/    /'
fi
# The first check may catch the unit mid-restart (its old cgroup still named): the next one says
# where it runs now.
if wait_for 15 sh -c 'cpupoolctl assignments | grep -Eq "drifter is degraded: .*system.slice"'; then
  pass "assignments says why (it sits in system.slice)"
else
  fail "assignments never named system.slice"; cpupoolctl assignments | sed 's/^/    /'
fi
check_output "status counts it" 'enforcement: +1 assignment' cpupoolctl status
check_output "pool show names it" 'degraded: +assignment drifter' cpupoolctl pool show dp
check_output "varlink Status counts it" '"degraded_assignments": 1' \
  python3 -m varlink.cli call "$VARLINK/org.cpupool.Manager.Status" '{}'
check_output "D-Bus GetAssignment says degraded" 'degraded' \
  busctl call org.cpupool.Manager1 /org/cpupool/Manager1 org.cpupool.Manager1 GetAssignment s drifter
drifter_in cpupool-dp.slice
systemctl restart drifter.service
if wait_for 15 sh -c 'cpupoolctl assignments | grep -Eq "drifter +dp .* applied"'; then
  pass "back in its slice, it is applied again"
else
  fail "drifter stayed degraded"; cpupoolctl assignments | sed 's/^/    /'
fi
kill $mon 2>/dev/null
check_output "monitor saw it degraded" 'drifter +degraded' cat /tmp/monitor.log
check_output "monitor saw it restored" 'drifter +restored' cat /tmp/monitor.log

# Back as it was.
systemctl stop drifter.service
check "release app" cpupoolctl pool release app
check "release drifter" cpupoolctl pool release drifter
rmdir $DP/app 2>/dev/null
rm -f /run/systemd/system/drifter.service /run/systemd/system/cpupoold.service.d/50-vmtest.conf \
  /etc/cpupoold/config.d/50-vmtest.toml /tmp/monitor.log
systemctl daemon-reload
check "restart with the packaged configuration" systemctl restart cpupoold
