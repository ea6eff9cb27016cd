# The systemd backend on real systemd and cgroup v2: the reserved pool on the host slices, pool
# slices, an isolated partition, cpupoolctl run, unit and pid targets with reclaim, restart and
# daemon-reexec. 4 CPUs: reserved 0, shared web 1, exclusive dp 2-3 isolated.
. "$(dirname "$0")/lib.sh"

CG=/sys/fs/cgroup
DP=$CG/cpupool.slice/cpupool-dp.slice
vm_pools "isolate = true"
check "restart with the 4-CPU pools" systemctl restart cpupoold
check_output "the systemd backend is used" 'through the systemd backend' \
  journalctl -b -u cpupoold --no-pager -o cat
check_output "system.slice AllowedCPUs=0" '^AllowedCPUs=0$' systemctl show -p AllowedCPUs system.slice
check_output "user.slice AllowedCPUs=0" '^AllowedCPUs=0$' systemctl show -p AllowedCPUs user.slice
check_output "system.slice cpuset.cpus.effective is 0" '^0$' cat $CG/system.slice/cpuset.cpus.effective
check_output "cpupool-dp.slice AllowedCPUs=2-3" '^AllowedCPUs=2-3$' systemctl show -p AllowedCPUs cpupool-dp.slice
check_output "cpupool-web.slice AllowedCPUs=1" '^AllowedCPUs=1$' systemctl show -p AllowedCPUs cpupool-web.slice
check_output "cpupool-dp.slice is active" '^active$' systemctl is-active cpupool-dp.slice
check_output "cpupool-dp partition reads isolated" '^isolated$' cat $DP/cpuset.cpus.partition
if [ -f $CG/cpuset.cpus.isolated ]; then
  check_output "cpuset.cpus.isolated holds 2-3 (6.7+)" '^2-3$' cat $CG/cpuset.cpus.isolated
  check_output "cpupool.slice grants 2-3 (cpuset.cpus.exclusive)" '^2-3$' cat $CG/cpupool.slice/cpuset.cpus.exclusive
else
  check_output "cpupool.slice is the root partition above it (before 6.7)" '^root$' cat $CG/cpupool.slice/cpuset.cpus.partition
fi
check_output "pool list shows the kernel's partition state" 'dp +exclusive +2-3 .* isolated' cpupoolctl pool list
check_output "systemd-run --slice=cpupool-web.slice runs on the pool" 'Cpus_allowed_list:[[:space:]]+1$' \
  systemd-run --wait --pipe --quiet --slice=cpupool-web.slice grep Cpus_allowed_list /proc/self/status

# cpupoolctl run: one CPU of 2-3, the environment, the exit status, released afterwards.
check_output "cpupoolctl run prints one CPU of dp" '^Cpus_allowed_list:[[:space:]]+[23]$' \
  cpupoolctl run --pool dp --cpus 1 -- grep Cpus_allowed_list /proc/self/status
check_output "cpupoolctl run passes CPUPOOL_POOL and EXCLUSIVE_CPUS" '^dp [23]$' \
  cpupoolctl run --pool dp --cpus 1 -- sh -c 'echo "$CPUPOOL_POOL $EXCLUSIVE_CPUS"'
check_output "cpupoolctl run runs in a scope in cpupool-dp.slice" 'cpupool-dp.slice/cpupool-run-' \
  cpupoolctl run --pool dp --cpus 1 -- cat /proc/self/cgroup
check_fails "cpupoolctl run forwards the exit status" 7 '' cpupoolctl run --pool dp --cpus 1 -- sh -c 'exit 7'
check_fails "cpupoolctl run --dbus on the shared pool" 3 '' \
  cpupoolctl --dbus run --pool web --millicpus 500 -- sh -c 'grep -q "Cpus_allowed_list:.*1$" /proc/self/status && exit 3'
# run becomes its command (systemd-run --scope's shape): the daemon releases the CPUs when the
# scope empties, a moment after the shell sees the exit. A run of the whole pool right after
# another is not refused for that moment: the daemon releases a run whose scope the kernel
# says is empty before it refuses a booking.
check "cpupoolctl run of all of dp, five times back to back" \
  sh -c 'for i in 1 2 3 4 5; do cpupoolctl run --pool dp --cpus 2 -- true || exit 1; done'
check "run leaves no assignment behind" \
  wait_for 30 sh -c 'cpupoolctl assignments | grep -q "^no assignments$"'

# now_us; gone_ms T0 ID: waits (up to 10 s) until assignment ID is gone, then prints how long
# after T0 (µs since the epoch) the daemon logged reclaiming it: the journal's own timestamp,
# so the polling here (slow under TCG) does not count.
now_us() { echo $(($(date +%s%N) / 1000)); }
gone_ms() {
  t0=$1 id=$2
  while cpupoolctl assignments --json | python3 -c 'import json, sys; sys.exit(0 if any(a["id"] == sys.argv[1] for a in json.load(sys.stdin)["assignments"]) else 1)' "$id"; do
    [ $(($(now_us) - t0)) -lt 10000000 ] || break
    sleep 0.05
  done
  at=$(journalctl -b -u cpupoold -o json --no-pager | python3 -c '
import json, sys
hits = [int(e["__REALTIME_TIMESTAMP"]) for e in map(json.loads, sys.stdin)
        if str(e.get("MESSAGE", "")).startswith("reclaimed assignment " + sys.argv[1] + " ")]
print(hits[-1] if hits else 0)' "$id")
  if [ "$at" -eq 0 ]; then echo 99999; else echo $(((at - t0) / 1000)); fi
}

# dp_unit NAME: a long-running service in the dp pool's slice (a runtime unit file).
dp_unit() {
  printf '[Service]\nSlice=cpupool-dp.slice\nExecStart=/bin/sleep infinity\n' >"/run/systemd/system/$1"
  systemctl daemon-reload
}

# A unit target in the pool's slice: AllowedCPUs set through systemd, reclaimed when it stops.
dp_unit some.service
check "start some.service" systemctl start some.service
check_output "assign dp to unit some.service" 'target: +unit:some.service' \
  cpupoolctl pool assign dp --unit some.service --cpus 1 --id some
cpu=$(cpupoolctl assignments --json | python3 -c 'import json,sys; print([a["cpus"] for a in json.load(sys.stdin)["assignments"] if a["id"]=="some"][0])')
check_output "systemctl show -p AllowedCPUs some.service matches ($cpu)" "^AllowedCPUs=$cpu\$" \
  systemctl show -p AllowedCPUs some.service
pid=$(systemctl show -p MainPID --value some.service)
check_output "some.service runs on CPU $cpu" "Cpus_allowed_list:[[:space:]]+$cpu\$" cat /proc/$pid/status
t0=$(now_us)
systemctl stop some.service
ms=$(gone_ms "$t0" some)
echo "unit reclaim: $ms ms" >>"$RESULTS/reclaim.txt"
if [ "$ms" -lt 1000 ]; then pass "a stopped unit is reclaimed within 1 s ($ms ms after systemctl stop was called)"; else fail "unit reclaim took $ms ms"; fi
check_output "the reclaim is logged" 'reclaimed assignment some .*unit some.service is (inactive|failed|gone)' \
  journalctl -b -u cpupoold --no-pager -o cat

# A pid target (a process in the pool's slice): reclaimed when it exits, through a pidfd.
systemd-run --quiet --slice=cpupool-dp.slice --unit=pidtest /bin/sleep infinity
wait_for 10 sh -c '[ "$(systemctl show -p MainPID --value pidtest.service)" != 0 ]'
pid=$(systemctl show -p MainPID --value pidtest.service)
check_output "assign dp to pid $pid" "target: +pid:$pid" cpupoolctl pool assign dp --pid "$pid" --cpus 1 --id pidtest
check_output "the process runs on one CPU of dp" 'Cpus_allowed_list:[[:space:]]+[23]$' cat /proc/$pid/status
t0=$(now_us)
kill "$pid"
ms=$(gone_ms "$t0" pidtest)
echo "pid reclaim: $ms ms" >>"$RESULTS/reclaim.txt"
if [ "$ms" -lt 1000 ]; then pass "an exited pid is reclaimed within 1 s ($ms ms after the kill)"; else fail "pid reclaim took $ms ms"; fi

# A cgroup target: reclaimed when its directory is removed, seen through an inotify watch on the
# cgroup (cgroupfs reports rmdir like any file system), not by looking twice a second.
mkdir -p "$CG/cpupool.slice/cpupool-dp.slice/cgtest"
check_output "assign dp to cgroup cpupool.slice/cpupool-dp.slice/cgtest" 'target: +cgroup:cpupool.slice/cpupool-dp.slice/cgtest' \
  cpupoolctl pool assign dp --cgroup cpupool.slice/cpupool-dp.slice/cgtest --cpus 1 --id cgtest
t0=$(now_us)
rmdir "$CG/cpupool.slice/cpupool-dp.slice/cgtest"
ms=$(gone_ms "$t0" cgtest)
echo "cgroup reclaim: $ms ms" >>"$RESULTS/reclaim.txt"
if [ "$ms" -lt 1000 ]; then pass "a removed cgroup is reclaimed within 1 s ($ms ms after rmdir)"; else fail "cgroup reclaim took $ms ms"; fi
check_output "its reclaim names the removal" 'reclaimed assignment cgtest .*cgroup cpupool.slice/cpupool-dp.slice/cgtest was removed' \
  journalctl -b -u cpupoold --no-pager -o cat
if journalctl -b -u cpupoold --no-pager -o cat | grep -q 'cannot watch cgroup'; then
  fail "a cgroup target could not be watched: $(journalctl -b -u cpupoold --no-pager -o cat | grep 'cannot watch cgroup' | tail -1)"
else
  pass "every cgroup target had its inotify watch"
fi

# Restart and daemon-reexec keep assignments and cgroup files.
dp_unit keeper.service
systemctl start keeper.service
check "assign dp to keeper.service" cpupoolctl pool assign dp --unit keeper.service --cpus 1 --id keeper
snapshot() {
  cpupoolctl assignments
  for f in system.slice/cpuset.cpus system.slice/cpuset.cpus.effective cpupool.slice/cpuset.cpus \
    cpupool.slice/cpupool-dp.slice/cpuset.cpus cpupool.slice/cpupool-dp.slice/cpuset.cpus.partition \
    cpupool.slice/cpupool-web.slice/cpuset.cpus cpupool.slice/cpupool-dp.slice/keeper.service/cpuset.cpus \
    cpupool.slice/cpupool-dp.slice/keeper.service/cpuset.cpus.effective; do
    echo "$f: $(cat $CG/$f)"
  done
  systemctl show -p AllowedCPUs system.slice cpupool-dp.slice keeper.service
}
before=$(snapshot)
check "systemctl restart cpupoold" systemctl restart cpupoold
after=$(snapshot)
if [ "$before" = "$after" ]; then pass "restart keeps assignments and cgroup files"; else
  fail "restart changed something"; printf '%s\n---\n%s\n' "$before" "$after" | sed 's/^/    /'; fi
reapplied() { journalctl -b -u cpupoold --no-pager -o cat | grep -c "systemd reloaded: state re-applied"; }
n0=$(reapplied)
check "systemctl daemon-reexec" systemctl daemon-reexec
if wait_for 20 sh -c "[ \$(journalctl -b -u cpupoold --no-pager -o cat | grep -c 'systemd reloaded: state re-applied') -gt $n0 ]"; then
  pass "daemon-reexec is followed by re-application"
else
  fail "no re-application logged after daemon-reexec"
  journalctl -b -u cpupoold --no-pager -o cat | tail -n 15 | sed 's/^/    /'
fi
check_output "cpupoold still answers after daemon-reexec" 'keeper' cpupoolctl assignments
after=$(snapshot)
if [ "$before" = "$after" ]; then pass "daemon-reexec keeps assignments and cgroup files"; else
  fail "daemon-reexec changed something"; printf '%s\n---\n%s\n' "$before" "$after" | sed 's/^/    /'; fi
echo "$after" >"$RESULTS/systemd-snapshot.txt"

# Back to the packaged configuration for the checks that follow.
systemctl stop keeper.service
wait_for 10 sh -c '! cpupoolctl assignments | grep -q keeper' || {
  fail "keeper.service stopped but its assignment stayed 10 s"
  cpupoolctl pool release keeper
}
rm -f /etc/cpupoold/config.d/50-vmtest.toml /run/systemd/system/some.service /run/systemd/system/keeper.service
systemctl daemon-reload
check "restart with the packaged configuration" systemctl restart cpupoold
check "the pool slices and cpupool.slice are gone" sh -c "! test -d $CG/cpupool.slice"
