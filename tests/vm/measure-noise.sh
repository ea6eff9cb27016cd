# OS noise on isolated CPUs, side by side; not a check of the default run: `tests/vm/run
# --measure` boots with 10-install, 20-service and this script (as checks/86-measure-noise.sh),
# twice per kernel: a plain boot (`$SHARE/measure-boot` reads `runtime`) and one with
# `nohz_full=2-3 rcu_nocbs=2-3` (`nohz_full`).
#
# Under the same host load on CPUs 0-1 (lib.sh's start_load, pinned there), with a spinning
# thread on CPU 3 (busy) and nothing on CPU 2 (idle), it counts per CPU and second over
# $WINDOW s what interrupted CPUs 2 and 3: /proc/interrupts by row (LOC is the tick, CAL/RES/TLB/
# IWI the IPIs by kind, numbered rows the devices), /proc/softirqs by type, and from tracefs
# (an instance limited to CPUs 2-3) the threads switched in, which timers expired, which work
# items ran. Debian's kernels lack the osnoise tracer; under TCG durations mean little, so each
# interruption is counted and named instead of timed. Configurations, in this order:
#   runtime boot:  none (dp exclusive, isolate = false), cpupoold (isolate = true),
#                  cpupoold-ticked (isolated while a thread kept CPU 2 busy, see below),
#                  tuned (no pools, cpupoold stopped, TuneD's cpu-partitioning profile),
#                  tuned-moved (plus every thread's affinity set to 0-1, which is what TuneD's
#                  scheduler plugin does; Debian's TuneD cannot load it: no python3-perf)
#   nohz_full boot: none, cpupoold
# Where the idle CPU's function-call IPIs come from: a kprobe on smp_call_function_single_async
# (the call kick_ilb makes) with target CPU 2 and a stacktrace trigger, in a second instance over
# all CPUs; the stacks and the kernel's sched domains of CPU 2 go to noise-ilb.txt.
# Results: noise.tsv (CONFIG CPU SOURCE PER_SECOND), noise.txt (details), noise-ilb.txt.
. "$(dirname "$0")/lib.sh"

BOOT=$(cat "$SHARE/measure-boot" 2>/dev/null || echo runtime)
OUT=$RESULTS/noise.txt
TSV=$RESULTS/noise.tsv
ILB=$RESULTS/noise-ilb.txt
: >"$OUT"
: >"$TSV"
: >"$ILB"
WINDOW=${MEASURE_WINDOW:-20}
T=/sys/kernel/tracing
N=$T/instances/noise
K=$T/instances/ilb
SPIN=/tmp/noise-spin

mountpoint -q $T || mount -t tracefs nodev $T
mountpoint -q /sys/kernel/debug || mount -t debugfs nodev /sys/kernel/debug
# The spinning thread under a name of its own, so that its switches are told apart.
cp /bin/dash "$SPIN"

# The tracing instances: "noise" records CPUs 2-3 (cpumask c) only; "ilb" every CPU, for the
# IPIs sent to CPU 2 (the sender's stack).
setup_tracing() {
  mkdir -p $N $K
  echo c >$N/tracing_cpumask
  echo 8192 >$N/buffer_size_kb
  for e in irq/irq_handler_entry softirq/softirq_entry sched/sched_switch \
    timer/timer_expire_entry timer/hrtimer_expire_entry workqueue/workqueue_execute_start; do
    [ -e $N/events/$e/enable ] && echo 1 >$N/events/$e/enable
  done
  for e in $N/events/irq_vectors/*_entry $N/events/ipi/*; do
    [ -e "$e/enable" ] && echo 1 >"$e/enable"
  done
  echo 'p:noise/csd smp_call_function_single_async target=%di:s32' >>$T/kprobe_events
  echo 'p:noise/kick kick_ilb flags=%di:x32' >>$T/kprobe_events 2>/dev/null ||
    echo "no kprobe on kick_ilb (inlined or absent in this kernel)" >>"$ILB"
  echo 2048 >$K/buffer_size_kb
  if [ -e $K/events/noise/csd ]; then
    echo 'target == 2' >$K/events/noise/csd/filter
    echo 'stacktrace if target == 2' >$K/events/noise/csd/trigger
    echo 1 >$K/events/noise/csd/enable
  fi
  [ -e $K/events/noise/kick ] && echo 1 >$K/events/noise/kick/enable
  echo 0 >$N/tracing_on
  echo 0 >$K/tracing_on
}

# spin NAME CPU [SLICE]: a unit NAME running a busy loop on CPU (in SLICE when given).
spin() {
  systemd-run --quiet --unit="$1" ${3:+--slice=$3} taskset -c "$2" "$SPIN" -c 'while :; do :; done'
}

# loc CPU: the tick count of CPU so far.
loc() { awk -v c=$(($1 + 2)) '$1 == "LOC:" { print $c }' /proc/interrupts; }
# ticked CPU FROM: CPU's tick count has gone 3 past FROM (it ran busy ticks).
ticked() { [ "$(loc "$1")" -ge $(($2 + 3)) ]; }

# rows A B CPU SECS PREFIX: per second for CPU between two copies of /proc/interrupts or
# /proc/softirqs: "PREFIX ROW RATE" for every row with a count; numbered rows summed as device.
rows() {
  awk -v col=$(($3 + 2)) -v secs="$4" -v pre="$5" '
    NR == FNR { if (FNR > 1) a[$1] = $col; next }
    FNR == 1 { next }
    $1 ~ /^[0-9]+:$/ { dev += $col - a[$1]; next }
    { d = $col - a[$1]; sub(/:$/, "", $1); if (d > 0) printf "%s %s %.2f\n", pre, $1, d / secs }
    END { if (pre == "irq") printf "irq device %.2f\n", dev / secs }' "$1" "$2"
}

# summarize TRACE CPU SECS: from the noise instance's trace, per second on CPU: threads switched
# in (not idle, not the spinner) and the most frequent timers, work items, threads, device IRQs.
summarize() {
  awk -v cpu="$2" -v secs="$3" -v spin="$(basename "$SPIN")" '
    match($0, /\[[0-9]+\]/) == 0 { next }
    { c = substr($0, RSTART + 1, RLENGTH - 2) + 0 }
    c != cpu { next }
    {
      for (i = 1; i <= NF; i++) if ($i ~ /^[a-z_]+:$/ && $(i - 1) ~ /^[0-9.]+:$/) { ev = $i; break }
      sub(/:$/, "", ev)
    }
    ev == "sched_switch" {
      if (match($0, /next_comm=[^ ]+/)) n = substr($0, RSTART + 10, RLENGTH - 10)
      if (match($0, /next_pid=[0-9]+/)) p = substr($0, RSTART + 9, RLENGTH - 9) + 0
      if (p != 0 && n != spin) { sw++; top["thread " n]++ }
      next
    }
    ev == "timer_expire_entry" || ev == "hrtimer_expire_entry" {
      if (match($0, /function=[^ ]+/)) top["timer " substr($0, RSTART + 9, RLENGTH - 9)]++
      next
    }
    ev == "workqueue_execute_start" {
      if (match($0, /function [^ ]+/)) top["work " substr($0, RSTART + 9, RLENGTH - 9)]++
      next
    }
    ev == "irq_handler_entry" {
      if (match($0, /name=[^ ]+/)) top["irq " substr($0, RSTART + 5, RLENGTH - 5)]++
      next
    }
    END {
      printf "trace switched-in %.2f\n", sw / secs
      for (k in top) printf "detail %s %.2f\n", k, top[k] / secs
    }' "$1"
}

# ilb_stacks TRACE: the stacks that sent CPU 2 a function call, by count, and kick_ilb's flags.
ilb_stacks() {
  awk '
    function done() { if (inst) n[key == "" ? "(no stack)" : key]++; inst = 0; key = ""; frames = 0 }
    / csd: / { done(); inst = 1; next }
    / kick: / { done(); if (match($0, /flags=[0-9a-fx]+/)) f[substr($0, RSTART, RLENGTH)]++; next }
    /<stack trace>/ { next }
    inst && /^ *=> / {
      fn = $2
      if (fn ~ /^_*(kprobe|trace|ftrace|event_|stack_trace|opt_pre|optimized_callback|aggr_pre|arch_rethook)/) next
      if (frames++ < 7) key = key (key == "" ? "" : " <- ") fn
      next
    }
    { done() }
    END {
      done()
      for (k in n) printf "%6d  %s\n", n[k], k
      for (k in f) printf "%6d  kick_ilb %s\n", f[k], k
    }' "$1" | sort -rn | head -n 12
}

# measure CONFIG: one window under load; the figures go to $TSV and $OUT, the stacks to $ILB.
measure() {
  start_load nload -p CPUAffinity=0-1
  echo >$N/trace
  echo >$K/trace
  cat /proc/interrupts >/tmp/n-irq-a
  cat /proc/softirqs >/tmp/n-soft-a
  t0=$(cut -d' ' -f1 /proc/uptime)
  echo 1 >$N/tracing_on
  echo 1 >$K/tracing_on
  sleep "$WINDOW"
  echo 0 >$N/tracing_on
  echo 0 >$K/tracing_on
  cat /proc/interrupts >/tmp/n-irq-b
  cat /proc/softirqs >/tmp/n-soft-b
  t1=$(cut -d' ' -f1 /proc/uptime)
  stop_load nload
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
  cat $N/trace >/tmp/n-trace
  cat $K/trace >/tmp/n-ilb
  echo "== $1 ($(uname -r)), ${secs} s under load; dropped events: $(grep -c 'LOST' /tmp/n-trace)" >>"$OUT"
  for cpu in 2 3; do
    {
      rows /tmp/n-irq-a /tmp/n-irq-b "$cpu" "$secs" irq
      rows /tmp/n-soft-a /tmp/n-soft-b "$cpu" "$secs" softirq
      summarize /tmp/n-trace "$cpu" "$secs"
    } >/tmp/n-rows
    grep -v '^detail ' /tmp/n-rows | awk -v c="$1" -v cpu="$cpu" '{ printf "%s\t%s\t%s %s\t%s\n", c, cpu, $1, $2, $3 }' >>"$TSV"
    echo "cpu$cpu: $(grep -v '^detail ' /tmp/n-rows | tr '\n' ';')" >>"$OUT"
    echo "cpu$cpu top: $(grep '^detail ' /tmp/n-rows | sort -k4 -rn | head -n 12 | cut -d' ' -f2- | tr '\n' ';')" >>"$OUT"
  done
  {
    echo "== $1 ($(uname -r)): function calls sent to CPU 2 in ${secs} s, by the sender's stack"
    ilb_stacks /tmp/n-ilb
    echo "sched domains of cpu2: $(ls /sys/kernel/debug/sched/domains/cpu2 2>/dev/null | tr '\n' ' ')"
  } >>"$ILB"
}

# pools ISOLATE: the measurement's pools (lib.sh's irq_pools), applied and read back.
pools() {
  irq_pools "$1"
  systemctl reload cpupoold.service
  if [ "$1" = true ]; then wait_for 60 dp_isolated; else wait_for 60 dp_member; fi
}

{
  echo "kernel $(uname -r); boot: $BOOT; cmdline: $(cat /proc/cmdline)"
  echo "nohz_full: $(cat /sys/devices/system/cpu/nohz_full 2>/dev/null); isolated: $(cat /sys/devices/system/cpu/isolated)"
  echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
} >>"$OUT"
setup_tracing

# 1. No isolation: dp is an exclusive pool, not isolated.
pools false
spin noise-spin3 3 cpupool-dp.slice
measure none
# 2. cpupoold's isolated pool, made while CPU 2 idles.
pools true
measure cpupoold

if [ "$BOOT" = runtime ]; then
  # 3. Isolated while CPU 2 is kept busy: a CPU leaves the scheduler's nohz idle mask
  # (nohz.idle_cpus_mask) only in a busy tick while it has a sched domain; made isolated while
  # idle it stays there and keeps being picked for idle load balancing.
  pools false
  from=$(loc 2)
  spin noise-spin2 2 cpupool-dp.slice
  wait_for 60 ticked 2 "$from"
  pools true
  systemctl stop noise-spin2.service
  measure cpupoold-ticked
  systemctl stop noise-spin3.service

  # 4. TuneD's cpu-partitioning at run time: no pools, cpupoold stopped.
  rm -f /etc/cpupoold/config.d/50-vmtest.toml
  systemctl reload cpupoold.service
  wait_for 60 sh -c '! cpupoolctl pool list | grep -q "^dp "'
  systemctl stop cpupoold.service
  # Libraries first: gawk pre-depends on two of them, which one dpkg run leaves unconfigured.
  check "TuneD's libraries install" dpkg -i "$SHARE"/tuned/lib*.deb
  check "TuneD installs (Debian 12's, from the share)" sh -c 'dpkg -i $(ls "$SHARE"/tuned/*.deb | grep -v "/lib[^/]*$")'
  echo 'isolated_cores=2-3' >/etc/tuned/cpu-partitioning-variables.conf
  systemctl start tuned.service
  wait_for 60 tuned-adm active
  check "tuned-adm profile cpu-partitioning" tuned-adm --timeout 300 profile cpu-partitioning
  {
    echo "== TuneD: $(tuned-adm active)"
    echo "what needs a reboot (bootloader plugin): $(cat /etc/tuned/bootcmdline 2>/dev/null)"
    echo "systemd CPUAffinity (next boot): $(grep '^CPUAffinity' /etc/systemd/system.conf)"
    echo "tuned-adm verify: $(tuned-adm verify 2>&1 | tail -n 3 | tr '\n' ' ')"
    echo "TuneD's errors: $(grep -E 'ERROR|unable|cannot' /var/log/tuned/tuned.log 2>/dev/null | sed 's/^[0-9:, -]*//' | sort -u | tr '\n' ';')"
  } >>"$OUT"
  spin noise-spin3 3
  measure tuned
  # 5. What TuneD's scheduler plugin would add: every thread that may move, moved to 0-1.
  spinner=$(systemctl show -p MainPID --value noise-spin3.service)
  for t in /proc/[0-9]*/task/[0-9]*; do
    tid=${t##*/}
    [ "$tid" = "$spinner" ] || taskset -pc 0-1 "$tid" >/dev/null 2>&1
  done
  measure tuned-moved
  systemctl stop noise-spin3.service tuned.service
else
  systemctl stop noise-spin3.service
  rm -f /etc/cpupoold/config.d/50-vmtest.toml
  systemctl reload cpupoold.service
fi

cat "$OUT" "$ILB"
check "measured every configuration" grep -q "^cpupoold	" "$TSV"
