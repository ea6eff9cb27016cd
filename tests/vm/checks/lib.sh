# Helpers for the guest checks; every check starts with `. "$(dirname "$0")/lib.sh"`.
# A check prints one `PASS what` or `FAIL what` line per assertion (the runner counts them)
# and may keep going after a FAIL, so one boot reports as much as it can.
# $RESULTS is the results directory on the share, for anything worth keeping (scores, dumps).

DEB=$(ls "$SHARE"/pkg/cpupoold_*.deb 2>/dev/null | head -n 1)
VARLINK=unix:/run/cpupoold/org.cpupool.Manager

pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; }

# daemon_said: the daemon's last journal lines, printed under a failed check (CI shows the
# output around a FAIL, not the guest's journal).
daemon_said() {
  echo "    cpupoold's journal, last lines:"
  journalctl -u cpupoold.service -n 12 -o short-monotonic --no-pager 2>&1 | sed 's/^/      /'
}

# check WHAT CMD...: PASS when CMD exits 0; otherwise FAIL with its exit code and output.
check() {
  what=$1
  shift
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" -eq 0 ]; then
    pass "$what"
  else
    fail "$what (exit $rc)"
    printf '%s\n' "$out" | tail -n 25 | sed 's/^/    /'
    daemon_said
  fi
}

# check_output WHAT REGEX CMD...: PASS when CMD exits 0 and its output matches REGEX (grep -E).
# grep reads all of its input (no -q): a grep that quits at the first match leaves printf
# writing into a closed pipe, and dash then reports "printf: I/O error".
check_output() {
  what=$1 re=$2
  shift 2
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" -eq 0 ] && printf '%s\n' "$out" | grep -E -- "$re" >/dev/null; then
    pass "$what"
  else
    fail "$what (exit $rc, wanted /$re/)"
    printf '%s\n' "$out" | tail -n 25 | sed 's/^/    /'
    daemon_said
  fi
}

# check_fails WHAT RC REGEX CMD...: PASS when CMD exits with RC and its output matches REGEX.
check_fails() {
  what=$1 want=$2 re=$3
  shift 3
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" -eq "$want" ] && printf '%s\n' "$out" | grep -E -- "$re" >/dev/null; then
    pass "$what"
  else
    fail "$what (exit $rc, wanted exit $want and /$re/)"
    printf '%s\n' "$out" | tail -n 25 | sed 's/^/    /'
    daemon_said
  fi
}

# wait_for SECONDS CMD...: retry CMD (quietly) every 0.2 s until it succeeds; 1 on timeout.
wait_for() {
  deadline=$(($(date +%s) + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 0.2
  done
}

# The daemon's main pid, for looking into its mount namespace.
main_pid() { systemctl show -p MainPID --value cpupoold.service; }

# vm_pools [TOML]: the 4-CPU pools of the systemd and kubelet checks (reserved 0, shared web 1,
# exclusive dp 2-3 in threads) in /etc/cpupoold/config.d/50-vmtest.toml, TOML appended after
# [pools.dp]. The check removes the file when it is done.
vm_pools() {
  vm_reserved_and_web >/etc/cpupoold/config.d/50-vmtest.toml
  cat >>/etc/cpupoold/config.d/50-vmtest.toml <<EOF
[pools.dp]
kind = "exclusive"
cpus = "2-3"
smt = "threads"
${1:-}
EOF
}

# The reserved pool (CPU 0) and the shared pool web (CPU 1) that vm_pools and vm_iso_pools
# begin with.
vm_reserved_and_web() {
  printf '[pools.reserved]\nkind = "reserved"\ncpus = "0"\n[pools.web]\nkind = "shared"\ncpus = "1"\n'
}

# vm_iso_pools [TOML]: an isolated pool beside one that is not, in
# /etc/cpupoold/config.d/50-vmtest.toml: reserved 0, shared web 1, exclusive dp 2, exclusive iso 3
# (isolate = true); TOML appended after [pools.iso].
vm_iso_pools() {
  vm_reserved_and_web >/etc/cpupoold/config.d/50-vmtest.toml
  cat >>/etc/cpupoold/config.d/50-vmtest.toml <<EOF
[pools.dp]
kind = "exclusive"
cpus = "2"
[pools.iso]
kind = "exclusive"
cpus = "3"
isolate = true
${1:-}
EOF
}

# irq_pools ISOLATE [TOML]: the pools of the interrupt checks and measurement (reserved 0-1, so
# irqbalance keeps running; exclusive dp 2-3 in threads, `isolate = ISOLATE`) in
# /etc/cpupoold/config.d/50-vmtest.toml, TOML appended after [pools.dp].
irq_pools() {
  cat >/etc/cpupoold/config.d/50-vmtest.toml <<EOF
[pools.reserved]
kind = "reserved"
cpus = "0-1"
[pools.dp]
kind = "exclusive"
cpus = "2-3"
smt = "threads"
isolate = $1
${2:-}
EOF
}

# dp_isolated / dp_member: whether irq_pools' dp (exclusive 2-3) is an isolated partition now, or
# a member, as `pool list` reads the kernel's state.
dp_isolated() { cpupoolctl pool list | grep -Eq '^dp +exclusive +2-3 .*isolated'; }
dp_member() { cpupoolctl pool list | grep -E '^dp +exclusive +2-3' | grep -vq isolated; }

# start_load NAME [OPTION...]: host load in system.slice as units NAME-{hog,dd,9p}.service: a CPU
# hog, a disk write loop with fsync, and reads of the 9p share (virtio interrupts); OPTIONs go to
# each systemd-run (e.g. -p CPUAffinity=0-1). stop_load NAME ends it.
start_load() {
  load_name=$1
  shift
  systemd-run --quiet "$@" --unit="$load_name-hog.service" sh -c 'while :; do :; done'
  systemd-run --quiet "$@" --unit="$load_name-dd.service" sh -c \
    "while :; do dd if=/dev/zero of=/var/tmp/$load_name bs=1M count=8 conv=fsync status=none; done"
  systemd-run --quiet "$@" --unit="$load_name-9p.service" sh -c \
    "while :; do cat $SHARE/pkg/*.deb $SHARE/checks/*.sh >/dev/null; done"
}
stop_load() {
  systemctl stop "$1-hog.service" "$1-dd.service" "$1-9p.service" 2>/dev/null
  rm -f "/var/tmp/$1"
}
