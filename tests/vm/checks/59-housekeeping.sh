# Kernel housekeeping and isolation health (issue 15 items 2-4): with dp 2-3 isolated the
# unbound workqueue mask excludes 2-3 (on 6.1 because cpupoold narrowed it, on 6.12 because the
# kernel does), restored after isolate = false + reload; status and pool show carry the
# isolation line; the daemon's device IRQ/s next to /proc/interrupts deltas in $RESULTS/health.txt.
# Kernel threads the kernel lets userspace move (PF_KTHREAD without PF_NO_SETAFFINITY) leave
# 2-3 on both kernels, and get their CPUs back after isolate = false (lists in kthreads.txt).
. "$(dirname "$0")/lib.sh"

WQ=/sys/devices/virtual/workqueue/cpumask
RESULTS=${RESULTS:-/tmp}
# Bits 2 and 3 of the last hex digit of a mask (CPUs 2-3 are in its lowest nibble).
has_2_3() { d=$(tr -d ',\n' <"$1" | tail -c 1); [ $((0x$d & 12)) -ne 0 ]; }
excludes_2_3() { ! has_2_3 "$1"; }

# Movable kernel threads allowed on more than one CPU, 2 or 3 among them: "pid comm list".
# Flags are /proc/PID/stat field 9 (counted after the name, which may hold spaces):
# PF_KTHREAD 0x200000, PF_NO_SETAFFINITY 0x4000000 (mawk has no bit operators).
kthreads_on_2_3() {
  for d in /proc/[0-9]*; do
    s=$(cat "$d/stat" 2>/dev/null) || continue
    l=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' "$d/status" 2>/dev/null) || continue
    printf '%s\t%s\n' "$s" "$l"
  done | awk -F'\t' '{
    st = $1; list = $2; comm = st
    sub(/^[0-9]+ \(/, "", comm); sub(/\) [^)]*$/, "", comm)
    rest = st; sub(/^.*\) /, "", rest); split(rest, f, " "); flags = f[7] + 0
    if (int(flags / 2097152) % 2 != 1 || int(flags / 67108864) % 2 == 1) next
    n = split(list, parts, ","); cpus = 0; on = 0
    for (i = 1; i <= n; i++) {
      m = split(parts[i], r, "-"); lo = r[1] + 0; hi = (m > 1 ? r[2] : r[1]) + 0
      cpus += hi - lo + 1; if (lo <= 3 && hi >= 2) on = 1
    }
    if (on && cpus > 1) { split(st, p, " "); print p[1], comm, list }
  }'
}
no_kthreads_on_2_3() { [ -z "$(kthreads_on_2_3)" ]; }
# Every thread of the list in $1 that still runs has the CPUs it had then.
kthreads_restored() {
  while read -r pid comm list; do
    [ -d "/proc/$pid" ] || continue
    now=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' "/proc/$pid/status" 2>/dev/null) || continue
    [ "$now" = "$list" ] || { echo "$pid $comm: $now, had $list"; return 1; }
  done <"$1"
}

before=$(cat $WQ)
kthreads_on_2_3 >"$RESULTS/kthreads-before.txt"
vm_pools "isolate = true"
check "restart with dp isolated" systemctl restart cpupoold
check "the unbound workqueue mask excludes 2-3" wait_for 10 excludes_2_3 $WQ
check "the writeback mask excludes 2-3" excludes_2_3 /sys/devices/virtual/workqueue/writeback/cpumask
check_output "status shows the isolation line" '^isolation dp: ' cpupoolctl status
check "no movable kernel thread is allowed on 2-3" wait_for 25 no_kthreads_on_2_3
kthreads_on_2_3 >"$RESULTS/kthreads-isolated.txt"
cat "$RESULTS/kthreads-isolated.txt"
check_output "pool show dp counts the kernel threads moved" '^kernel threads: +([0-9]+ moved off 2-3|none on 2-3 \(the kernel keeps them off\))' \
  cpupoolctl pool show dp
check_output "pool show dp counts the IRQs moved" '^irqs: +[0-9]+ moved off 2-3' cpupoolctl pool show dp
cpupoolctl pool show dp >"$RESULTS/pool-show-isolated.txt" 2>&1
# The daemon's own re-pinning on a real kernel: put kthreadd back on every CPU by hand. A
# kernel that confines the root cgroup's tasks keeps it off 2-3 itself; otherwise the daemon's
# next check (10 s) must narrow it to the housekeeping CPU and say so.
taskset -pc 0-3 2 >/dev/null 2>&1
kthreadd_now=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/2/status)
echo "kthreadd after taskset -pc 0-3: $kthreadd_now" >>"$RESULTS/kthreads-isolated.txt"
kthreadd_off() { [ "$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/2/status)" = 0 ]; }
case $kthreadd_now in
  0 | 0-1 | 1) pass "kthreadd rewritten to 0-3: the kernel keeps it off 2-3 itself ($kthreadd_now)" ;;
  *)
    check "kthreadd rewritten to 0-3 is narrowed to CPU 0 by the daemon" wait_for 25 kthreadd_off
    check_output "the journal says the daemon moved kernel threads" 'kernel threads: [0-9]+ moved off 2-3' \
      journalctl -u cpupoold.service -o cat --since "-60s"
    ;;
esac
# Two health samples (5 s apart) before the line is a measurement.
wait_for 15 sh -c 'cpupoolctl pool show dp | grep -Eq "^isolation: +(holds|[0-9.]+ IRQ/s)"'
check_output "pool show dp shows isolation health" '^isolation: +(holds|[0-9.]+ IRQ/s|.*tasks outside)' \
  cpupoolctl pool show dp
check_output "GetIsolation over D-Bus" 'holds|leaks' \
  busctl call org.cpupool.Manager1 /org/cpupool/Manager1 org.cpupool.Manager1 GetIsolation s dp

# The daemon's figure against /proc/interrupts over about the same 10 s: device IRQs on 2-3.
dev_irqs_2_3() {
  awk 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
       $1 ~ /^[0-9]+:$/ { s += $(col["CPU2"] + 1) + $(col["CPU3"] + 1) } END { print s + 0 }' /proc/interrupts
}
a=$(dev_irqs_2_3); t0=$(date +%s)
dd if=/dev/zero of=/var/tmp/hk-load bs=1M count=256 oflag=direct 2>/dev/null
sleep 10
b=$(dev_irqs_2_3); t1=$(date +%s)
{
  echo "kernel: $(uname -r)"
  echo "/proc/interrupts device IRQs on CPUs 2-3: $(( (b - a) / (t1 - t0) ))/s over $((t1 - t0)) s"
  echo "daemon: $(cpupoolctl pool show dp | grep '^isolation:')"
  cpupoolctl status | grep '^isolation'
} >"$RESULTS/health.txt"
rm -f /var/tmp/hk-load
check_output "the daemon's health line is sane" '^daemon: isolation: +(holds|[0-9.]+ IRQ/s from irq [0-9]+ .* on CPU [23])' \
  cat "$RESULTS/health.txt"

# Isolation ends: the mask comes back.
vm_pools "isolate = false"
check "reload with isolate = false" cpupoolctl reload
check_output "the unbound workqueue mask is restored" "^$before\$" cat $WQ
check "the kernel threads have their CPUs back" kthreads_restored "$RESULTS/kthreads-before.txt"
{ echo "kernel: $(uname -r)"; echo "before: $(wc -l <"$RESULTS/kthreads-before.txt") movable on 2-3"
  grep '^kernel threads:' "$RESULTS/pool-show-isolated.txt"; } >"$RESULTS/kthreads.txt" 2>&1
rm -f /etc/cpupoold/config.d/50-vmtest.toml
check "reload without the test pools" cpupoolctl reload
