# Measures isolation in the guest; not a check of the default run: `tests/vm/run --measure`
# boots with only 10-install, 20-service and this script (as checks/85-measure-isolation.sh).
# Pools: reserved 0-1, dp 2-3 isolated, with host load in system.slice (as in 58-irq.sh).
# For "before" (irq = "none": interrupts left where they are) and "after" (the defaults) it
# prints, per isolated CPU over $WINDOW s: device IRQs/s, IPIs/s (the CAL/RES/TLB/IWI rows) and
# local timer IRQs/s from /proc/interrupts, and task time from /proc/stat (nothing runs in dp,
# so all of it is foreign), next to the daemon's own figures (GetIsolation). Then the daemon's
# CPU time over 60 s idle with the health sampler at its default interval and disabled
# (--health-interval 0). Everything goes to $RESULTS/measure.txt.
. "$(dirname "$0")/lib.sh"

OUT=$RESULTS/measure.txt
: >"$OUT"
WINDOW=${MEASURE_WINDOW:-20}
IDLE=${MEASURE_IDLE:-60}
NCPU=$(head -n 1 /proc/interrupts | wc -w)
HZ=$(getconf CLK_TCK)
DROPIN=/run/systemd/system/cpupoold.service.d/50-measure.conf

# The daemon's isolation of dp, as JSON (the PyPI varlink client is in the image).
isolation() {
  python3 -m varlink.cli call "$VARLINK/org.cpupool.Manager.GetIsolation" '{"pool": "dp"}'
}
measured() { isolation | grep -Eq '"state": "(holds|leaks)"'; }

# cpu_ticks FILE CPU: user + nice + system of CPU in a /proc/stat copy.
cpu_ticks() { awk -v c="cpu$2" '$1 == c { print $2 + $3 + $4 }' "$1"; }

# rates A B CPU SECS: "device ipi loc" per second for CPU between /proc/interrupts copies.
rates() {
  awk -v ncpu="$NCPU" -v col=$(($3 + 2)) -v secs="$4" '
    NR == FNR { if (FNR > 1) a[$1] = $col; next }
    FNR == 1 { next }
    { d = $col - a[$1] }
    $1 ~ /^[0-9]+:$/ { dev += d }
    $1 ~ /^(CAL|RES|TLB|IWI):$/ { ipi += d }
    $1 == "LOC:" { loc += d }
    END { printf "%.1f %.1f %.1f", dev / secs, ipi / secs, loc / secs }' "$1" "$2"
}

# measure LABEL [TOML]: restart with the pools, load, two health samples, then the window.
measure() {
  irq_pools true "$2"
  systemctl restart cpupoold
  start_load mload
  wait_for 30 measured
  cat /proc/interrupts >/tmp/m-irq-a
  cat /proc/stat >/tmp/m-stat-a
  t0=$(cut -d' ' -f1 /proc/uptime)
  sleep "$WINDOW"
  cat /proc/interrupts >/tmp/m-irq-b
  cat /proc/stat >/tmp/m-stat-b
  t1=$(cut -d' ' -f1 /proc/uptime)
  isolation >/tmp/m-daemon.json
  stop_load mload
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
  {
    echo "== $1 ($(uname -r)), ${secs} s under load"
    echo "CPU  device/s  IPI/s  LOC/s  task%   | daemon: device/s  IPI/s  LOC/s"
    for cpu in 2 3; do
      set -- $(rates /tmp/m-irq-a /tmp/m-irq-b "$cpu" "$secs")
      a=$(cpu_ticks /tmp/m-stat-a "$cpu") b=$(cpu_ticks /tmp/m-stat-b "$cpu")
      task=$(awk -v a="$a" -v b="$b" -v hz="$HZ" -v s="$secs" 'BEGIN { printf "%.2f", (b - a) / hz / s * 100 }')
      daemon=$(python3 -c '
import json, sys
d = json.load(open("/tmp/m-daemon.json"))["pools"][0]
c = [x for x in d["per_cpu"] if x["cpu"] == int(sys.argv[1])][0]
print("%.1f %.1f %.1f" % (c["device_irqs_per_sec"], c["ipis_per_sec"], c["timer_per_sec"]))' "$cpu")
      printf '%-4s %-9s %-6s %-6s %-7s | %s\n' "$cpu" "$1" "$2" "$3" "$task" "$daemon"
    done
    python3 -c '
import json
d = json.load(open("/tmp/m-daemon.json"))["pools"][0]
print("daemon: isolation %s; foreign task time %.2f%%" % (d["summary"], d["foreign_percent"]))
print("daemon: irqs %s; kernel threads %s" % (d["irqs"] or "-", d["kthreads"] or "-"))'
    echo "workqueue mask $(cat /sys/devices/virtual/workqueue/cpumask)"
  } >>"$OUT" 2>&1
}

measure before 'irq = "none"'
measure after ''

# The daemon's own CPU time over $IDLE s, no load: "TICKS MS", utime + stime of the process
# (every thread, in 1/HZ s) and the sum of its threads' schedstat run time (ns precision;
# threads that exit in between take theirs with them).
run_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $1 } END { printf "%.0f", s }'; }
ticks() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"; }
cpu_time() {
  pid=$(main_pid)
  a=$(ticks "$pid") na=$(run_ns "$pid")
  sleep "$IDLE"
  b=$(ticks "$pid") nb=$(run_ns "$pid")
  echo "$((b - a)) $(awk -v a="$na" -v b="$nb" 'BEGIN { printf "%.1f", (b - a) / 1e6 }')"
}
systemctl restart cpupoold
wait_for 30 measured
with=$(cpu_time)
mkdir -p "$(dirname "$DROPIN")"
printf '[Service]\nExecStart=\nExecStart=/usr/bin/cpupoold --health-interval 0\n' >"$DROPIN"
systemctl daemon-reload
systemctl restart cpupoold
wait_for 30 cpupoolctl status
without=$(cpu_time)
rm -f "$DROPIN"
systemctl daemon-reload
{
  echo "== daemon CPU time over ${IDLE} s idle ($(uname -r)), ticks of 1/${HZ} s"
  set -- $with $without
  echo "health sampler every 5 s: $1 ticks, $2 ms; disabled: $3 ticks, $4 ms; ratio $(awk -v a="$2" -v b="$4" \
    'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }') (run time)"
} >>"$OUT"

rm -f /etc/cpupoold/config.d/50-vmtest.toml
systemctl restart cpupoold
cat "$OUT"
check "measured both configurations" grep -q '^== after' "$OUT"
