# The metrics endpoint of the installed daemon (issue 18): cpupoold-metrics.socket listens on
# 127.0.0.1:9465 and passes the socket to the service (whose RestrictAddressFamilies= has no
# AF_INET); a scrape shows the pools. With dp 2-3 isolated and host I/O load, one movable
# device IRQ is pinned to CPU 2 by hand: the daemon's isolation-health figures for CPU 2 must
# rise with /proc/interrupts (device IRQ/s above zero, the IRQ named), and fall back to zero once
# the IRQ is off CPU 2 again. Figures go to $RESULTS/metrics.txt.
. "$(dirname "$0")/lib.sh"

OUT=$RESULTS/metrics.txt
: >"$OUT"
URL=http://127.0.0.1:9465/metrics

scrape() {
  python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' "$URL"
}
# metric NAME_WITH_LABELS: its value in a fresh scrape (empty when absent).
metric() { scrape | awk -v k="$1" '$1 == k { print $2; exit }'; }
# above_zero NAME_WITH_LABELS: exit 0 when the metric is present and > 0.
above_zero() { v=$(metric "$1"); [ -n "$v" ] && awk -v v="$v" 'BEGIN { exit !(v > 0) }'; }
at_zero() { v=$(metric "$1"); [ -n "$v" ] && awk -v v="$v" 'BEGIN { exit !(v == 0) }'; }

check_output "cpupoold-metrics.socket is active" '^active$' systemctl is-active cpupoold-metrics.socket
check_output "the service keeps its address families (no AF_INET)" '^RestrictAddressFamilies=(AF_UNIX AF_NETLINK|AF_NETLINK AF_UNIX)$' \
  systemctl show -p RestrictAddressFamilies cpupoold.service
check_output "the daemon serves the socket systemd passed" 'metrics: serving the TCP socket passed by the service manager' \
  journalctl -u cpupoold.service -o cat --no-pager
check_output "a scrape answers with the build info" '^cpupoold_build_info\{' scrape

irq_pools true
check "reload with dp isolated" systemctl reload cpupoold.service
check_output "the scrape shows dp's 2 CPUs" '^cpupoold_pool_cpus\{pool="dp",kind="exclusive"\} 2' scrape
# Two health samples (5 s apart) before the isolation figures exist.
has_cpu2_figure() { scrape | grep -q '^cpupoold_isolation_device_interrupts_per_second{pool="dp",cpu="2"}'; }
check "isolation figures appear for CPU 2" wait_for 20 has_cpu2_figure

start_load metricsload
# The busiest movable device IRQ under this load: increments over 3 s, then a write of its own
# affinity back (refused for managed IRQs, whose placement the kernel keeps).
cat /proc/interrupts >/tmp/m-a; sleep 3; cat /proc/interrupts >/tmp/m-b
NCPU=$(head -n 1 /proc/interrupts | wc -w)
IRQ=""
for n in $(awk -v ncpu="$NCPU" 'NR == FNR { if ($1 ~ /^[0-9]+:$/) for (i = 2; i <= ncpu + 1; i++) a[$1] += $i; next }
    $1 ~ /^[0-9]+:$/ { s = 0; for (i = 2; i <= ncpu + 1; i++) s += $i; d = s - a[$1]; if (d > 0) print d, $1 }' /tmp/m-a /tmp/m-b \
    | sort -rn | awk '{ sub(/:$/, "", $2); print $2 }'); do
  f=/proc/irq/$n/smp_affinity_list
  cur=$(cat "$f" 2>/dev/null) || continue
  if (printf '%s\n' "$cur" >"$f") 2>/dev/null; then IRQ=$n; OLD=$cur; break; fi
done
if [ -z "$IRQ" ]; then
  fail "no movable device IRQ fires under the load"
else
  echo "kernel $(uname -r): IRQ $IRQ ($(awk -v n="$IRQ:" '$1 == n { print $NF }' /proc/interrupts)), affinity $OLD" >>"$OUT"
  cpu2_count() { awk -v n="$IRQ:" '$1 == n { print $4 }' /proc/interrupts; }
  a=$(cpu2_count)
  printf '2\n' >/proc/irq/$IRQ/smp_affinity_list
  # One scrape kept: the checks below read the same health interval.
  risen() {
    scrape >/tmp/m-scrape
    v=$(awk '$1 == "cpupoold_isolation_device_interrupts_per_second{pool=\"dp\",cpu=\"2\"}" { print $2 }' /tmp/m-scrape)
    [ -n "$v" ] && awk -v v="$v" 'BEGIN { exit !(v > 0) }'
  }
  # The first health sample after the pin shows the rise (a rate over the interval before it),
  # and every scrape until the next sample shows it too. 60 s is a guard, not a measurement: it
  # failed once at 20 s (6.1, the host running the test suite beside the TCG guest) with the
  # IRQ counted on CPU 2 and no sample showing it; not seen again without that load.
  check "device IRQ/s on CPU 2 rise above zero" wait_for 60 risen
  b=$(cpu2_count)
  echo "/proc/interrupts: IRQ $IRQ on CPU 2: +$((b - a))" >>"$OUT"
  check "/proc/interrupts counts IRQ $IRQ on CPU 2 too" test "$((b - a))" -gt 0
  grep -E '^cpupoold_isolation_(device|irq)_interrupts_per_second\{pool="dp",cpu="2"' /tmp/m-scrape >>"$OUT"
  check_output "the busy IRQ is named on CPU 2" "^cpupoold_isolation_irq_interrupts_per_second\\{pool=\"dp\",cpu=\"2\",irq=\"$IRQ\"\\} " cat /tmp/m-scrape
  check_output "isolation no longer holds for dp" '^cpupoold_isolation_holds\{pool="dp"\} 0' cat /tmp/m-scrape
  # Off CPU 2 again (the daemon's own pass may have done it already).
  printf '%s\n' "$OLD" >/proc/irq/$IRQ/smp_affinity_list 2>/dev/null || true
  check "device IRQ/s on CPU 2 fall back to zero" wait_for 30 at_zero 'cpupoold_isolation_device_interrupts_per_second{pool="dp",cpu="2"}'
fi
stop_load metricsload
scrape | grep -E '^cpupoold_(isolation_|drift_|state_save_duration_seconds_count|api_requests_total)' >>"$OUT"
sed 's/^/    /' "$OUT"

rm -f /etc/cpupoold/config.d/50-vmtest.toml
check "reload without the test pools" systemctl reload cpupoold.service
