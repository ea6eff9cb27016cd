# The scheduler's idle load balancing leaves an isolated pool's idle CPUs alone. An isolated
# cpuset partition takes its CPUs out of the scheduler's domains; one that idles at that moment
# stays in the kernel's nohz idle mask for good and is kicked to balance for the others at their
# ticks: a function-call IPI (CAL) and a SCHED softirq each time, about 250 a second with load on
# the reserved CPUs (Linux 6.1 and 6.12, docs/performance.md). cpupoold keeps the CPUs busy
# across the partition write (src/host/cgroupfs/settle.rs). With dp (2-3) made isolated while
# idle and host load pinned to 0-1, CPUs 2-3 must take fewer than 25 function calls and SCHED
# softirqs a second each (counts over the window, not timings). Figures: $RESULTS/idle-balance.txt.
. "$(dirname "$0")/lib.sh"

OUT=$RESULTS/idle-balance.txt
WINDOW=15
LIMIT=25

# count FILE ROW: the row's counts for CPUs 2 and 3 of /proc/interrupts or /proc/softirqs, summed.
count() { awk -v r="$2:" '$1 == r { print $4 + $5 }' "$1"; }

irq_pools false
check "reload with dp exclusive, not isolated" systemctl reload cpupoold.service
check "dp is not isolated" wait_for 60 dp_member
# CPUs 2-3 idle now: nothing runs in dp. Then they become isolated.
irq_pools true
check "reload with dp isolated" systemctl reload cpupoold.service
check "dp is an isolated partition" wait_for 60 dp_isolated
check "no cpupool-settle cgroup is left" sh -c '! find /sys/fs/cgroup -name cpupool-settle | grep -q .'
start_load ilbload -p CPUAffinity=0-1
cp /proc/interrupts /tmp/ilb-irq-a
cp /proc/softirqs /tmp/ilb-soft-a
sleep "$WINDOW"
cp /proc/interrupts /tmp/ilb-irq-b
cp /proc/softirqs /tmp/ilb-soft-b
stop_load ilbload
cal=$(($(count /tmp/ilb-irq-b CAL) - $(count /tmp/ilb-irq-a CAL)))
sched=$(($(count /tmp/ilb-soft-b SCHED) - $(count /tmp/ilb-soft-a SCHED)))
echo "$(uname -r): CPUs 2-3 idle and isolated, load on 0-1, ${WINDOW} s: function-call IPIs $cal ($((cal / WINDOW))/s), SCHED softirqs $sched ($((sched / WINDOW))/s)" >>"$OUT"
check "idle isolated CPUs: under $LIMIT function-call IPIs a second ($cal in ${WINDOW} s)" \
  test "$cal" -lt $((LIMIT * WINDOW))
check "idle isolated CPUs: under $LIMIT SCHED softirqs a second ($sched in ${WINDOW} s)" \
  test "$sched" -lt $((LIMIT * WINDOW))

rm -f /etc/cpupoold/config.d/50-vmtest.toml
check "reload without the test pools" systemctl reload cpupoold.service
