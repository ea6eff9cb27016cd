# The NRI plugin against the real containerd 1.7 (NRI 0.6.1, systemd cgroup driver), with the
# kubelet's part played by examples/kubelet_peer.rs: Allocate over the device-plugin socket,
# then RunPodSandbox / CreateContainer / StartContainer over the real CRI with the environment
# Allocate gave. Checked: the container's first process runs on its allocated CPU (it prints
# its own Cpus_allowed_list), its scope holds it, the books say so; a container without a pool
# and the pod's sandbox are kept off the exclusive CPUs from their start; a containerd restart
# and a cpupoold restart keep it; the stop releases at once; an isolated pool's container is an
# isolated partition of its own (6.7+), or the daemon says why not (6.1); without NRI status says
# which path. 4 CPUs: reserved 0, shared web 1, exclusive dp 2-3.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/containers.sh"

KD=/var/lib/kubelet
PODS=/run/kubelet-peer-pods.json
pods() { printf '%s\n' "$1" >$PODS.tmp && mv $PODS.tmp $PODS; }
nri_logs() { journalctl -u cpupoold --no-pager -o cat | grep 'NRI: '; }
# measure_starts N TAG: the median milliseconds of N CreateContainer+StartContainer of a container
# without a pool in the current pod (each stopped and removed after). Measured, never checked:
# the figures go to $RESULTS/nri-measure.txt.
measure_starts() {
  local i t0 t1 ms=""
  for i in $(seq 1 "$1"); do
    t0=$(date +%s%N)
    ctr_start "m$2$i" >/dev/null || return 1
    t1=$(date +%s%N)
    ms="$ms $(((t1 - t0) / 1000000))"
    ctr_stop "m$2$i" >/dev/null && ctr_remove "m$2$i" >/dev/null || return 1
  done
  printf '%s\n' $ms | sort -n | sed -n "$((($1 + 1) / 2))p"
}

vm_pools "[kubelet]
release_grace_ms = 600000"
pods '{"pods": []}'
# The kubelet's directory before the daemon starts (as on a node that has joined), and the
# kubelet's registration and PodResources; its CRI is containerd's, not the peer's.
rm -rf $KD
mkdir -p $KD/device-plugins $KD/pod-resources
"$PEER" serve $KD /run/kubelet-peer-unused-cri.sock $PODS >/run/peer-nri.log 2>&1 &
peer=$!
since=$(date '+%Y-%m-%d %H:%M:%S')
check "restart cpupoold with the kubelet pools" systemctl restart cpupoold
check "dp registers with the kubelet" wait_for 60 grep -q '^registered cpupool.io/dp ' /run/peer-nri.log
check "the plugin registers with containerd and is synchronized" wait_for 30 sh -c \
  "journalctl -u cpupoold --since '$since' --no-pager -o cat | grep -q 'NRI: synchronized with containerd'"
check_output "status says containers get their CPUs at creation" 'containers: +NRI \(containerd .*when it is created' \
  cpupoolctl status
[ -e /usr/local/share/cpupool-vm/images.tar ] && images_import >/dev/null 2>&1

# The kubelet allocates one dp CPU to the container `app` of a BestEffort pod.
uid=0a1b2c3d-0000-4000-8000-0000000000a1
alloc=$("$PEER" allocate $KD dp 1 $PODS default/nri-0/$uid/app/pending 2>/run/peer-nri-allocate.err)
cpu=$(printf '%s' "$alloc" | sed -n 's/.*"CPUPOOL_CPUS":"\([0-9]*\)".*/\1/p')
check_output "Allocate gives one of dp's CPUs and the assignment's id" '"CPUPOOL_ASSIGNMENT":"kubelet-cpu-[23]"' echo "$alloc"
pod=$(pod_start default/nri-0/$uid/besteffort)
[ -n "$pod" ] || { fail "RunPodSandbox"; exit 1; }
slice=$(pod_slice)
check_output "the pod's sandbox runs off the exclusive CPUs from its start" '^0-1$' \
  cat "$slice/cri-containerd-$pod.scope/cpuset.cpus.effective"

id=$(ctr_start app "$alloc")
[ -n "$id" ] || { fail "CreateContainer and StartContainer: $alloc $(cat /run/peer-nri-allocate.err)"; exit 1; }
check_output "the container's first process ran on CPU $cpu only" "^$cpu\$" ctr_cpus app
check_output "it has the environment Allocate gave" "^$cpu\$" ctr_env app CPUPOOL_CPUS
check_output "its scope holds CPU $cpu" "^$cpu\$" cat "$slice/cri-containerd-$id.scope/cpuset.cpus.effective"
check_output "the assignment is bound to its scope, applied" \
  "kubelet-cpu-$cpu +dp +$cpu +1000m +applied +cgroup:kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod$(echo $uid | tr - _).slice/cri-containerd-$id.scope +default/nri-0/app" \
  cpupoolctl assignments
check_output "the log says it was read back at start" "container default/nri-0/app starts on CPUs $cpu of pool dp" nri_logs

# A container without a pool device: the reserved and shared CPUs only, from its first instruction.
side=$(ctr_start side)
check_output "a container without a pool ran on 0-1 only" '^0-1$' ctr_cpus side
check_output "and its scope is kept there" '^0-1$' cat "$slice/cri-containerd-$side.scope/cpuset.cpus.effective"
with_nri=$(measure_starts 5 n)
check "create+start measured with the plugin: ${with_nri} ms (median of 5)" test -n "$with_nri"

# containerd restarts: the plugin connects again and is synchronized; nothing moves.
n=$(nri_logs | grep -c 'synchronized with containerd')
check "containerd restarts" systemctl restart containerd
check "the plugin is synchronized again" wait_for 60 sh -c \
  "test \$(journalctl -u cpupoold --no-pager -o cat | grep -c 'NRI: synchronized with containerd') -gt $n"
check_output "the assignment stays bound" "kubelet-cpu-$cpu .*applied .*cri-containerd-$id.scope" cpupoolctl assignments
check_output "the container still runs on CPU $cpu" "^$cpu\$" cat "$slice/cri-containerd-$id.scope/cpuset.cpus.effective"

# cpupoold restarts with the containers running: it loses and moves nothing.
check "cpupoold restarts" systemctl restart cpupoold
check "and is synchronized again" wait_for 60 sh -c \
  "systemctl -q is-active cpupoold && cpupoolctl status | grep -q 'containers: *NRI'"
check_output "the assignment is still bound" "kubelet-cpu-$cpu .*applied .*cri-containerd-$id.scope" cpupoolctl assignments
check_output "the container's CPU is unchanged" "^$cpu\$" cat "$slice/cri-containerd-$id.scope/cpuset.cpus.effective"
check_output "the other one's too" '^0-1$' cat "$slice/cri-containerd-$side.scope/cpuset.cpus.effective"

# The container stops: its CPU is released by the time the CRI's StopContainer returns.
check "StopContainer" ctr_stop app 2
check "its assignment is gone" sh -c '! cpupoolctl assignments | grep -q kubelet-cpu-'
check_output "released at the stop, said so" "released kubelet-cpu-$cpu .*container default/nri-0/app stopped" nri_logs
check "RemoveContainer" ctr_remove app
check "the other container stops" ctr_stop side 2
check "and is removed" ctr_remove side

# The states through a container's whole life, polled every 0.1 s against the real containerd:
# `allocated` from Allocate until it runs, `applied` only from its StartContainer (asked) to its
# StopContainer (answered), then released. A run of `applied` readings outside that window
# longer than 1 s fails; the timings go to $RESULTS/nri-states.txt.
ms() { echo $(($(date +%s%N) / 1000000)); }
poll_states() { # OUT: "MS STATE" lines for kubelet-cpu-2/3 until OUT.stop exists
  local st
  while [ ! -e "$1.stop" ]; do
    st=$(cpupoolctl assignments 2>/dev/null | awk '$1 ~ /^kubelet-cpu-[23]$/ {print $5}')
    echo "$(ms) ${st:-none}" >>"$1"
    sleep 0.1
  done
}
polled=/run/nri-states.log
rm -f $polled $polled.stop
poll_states $polled &
poller=$!
t_alloc0=$(ms)
alloc=$("$PEER" allocate $KD dp 1 $PODS default/nri-0/$uid/polled/pending 2>/run/peer-nri-allocate.err)
t_alloc=$(ms)
check_output "Allocate for the polled container" '"CPUPOOL_ASSIGNMENT":"kubelet-cpu-[23]"' echo "$alloc"
check_output "allocated before its container exists" 'kubelet-cpu-[23] .*allocated +kubelet:' cpupoolctl assignments
t_start0=$(ms)
polled_id=$(ctr_start polled "$alloc")
t_started=$(ms)
check "the polled container runs" test -n "$polled_id"
check_output "applied once it runs" "kubelet-cpu-[23] .*applied .*cri-containerd-$polled_id.scope" cpupoolctl assignments
t_stop0=$(ms)
check "the polled container stops" ctr_stop polled 2
t_stopped=$(ms)
: >$polled.stop
wait $poller
check "and is removed" ctr_remove polled
# The longest run of `applied` readings before the start was asked or after the stop answered.
longest=$(awk -v s="$t_start0" -v e="$t_stopped" '
  { bad = ($2 == "applied" && ($1 < s || $1 > e)) }
  bad && !in_run { in_run = 1; from = $1 }
  !bad && in_run { in_run = 0; if ($1 - from > max) max = $1 - from }
  END { if (in_run && last - from > max) max = last - from; print max + 0 }
  { last = $1 }' $polled)
{
  echo "$(date -u +%F) kernel $(uname -r), $(containerd --version 2>/dev/null | cut -d' ' -f3): ms from Allocate asked"
  echo "Allocate answered $((t_alloc - t_alloc0)); create+start asked $((t_start0 - t_alloc0)), answered $((t_started - t_alloc0)); stop asked $((t_stop0 - t_alloc0)), answered $((t_stopped - t_alloc0))"
  for st in allocated applied none; do
    awk -v st=$st -v t0=$t_alloc0 '$2 == st { if (!n++) f = $1; l = $1 } END { if (n) printf "%s: %d readings, %d..%d\n", st, n, f - t0, l - t0 }' $polled
  done
  echo "longest run of applied outside its container's life: $longest ms"
} | tee -a "$RESULTS/nri-states.txt"
check "no run of applied outside its container's life lasts 1 s (longest: $longest ms)" test "$longest" -lt 1000
check "it read allocated before its container started" \
  awk -v s="$t_start0" '$2 == "allocated" && $1 < s { found = 1 } END { exit !found }' $polled
check "the pod goes" pod_remove

# An isolated pool beside one that is not: reserved 0, web 1, dp 2, iso 3 (isolate = true). Where
# the kernel has cpuset.cpus.exclusive (6.7), iso's container is an isolated partition of its own
# and dp's keeps its CPU; where it has not (6.1), no partition is made while the kubelet's pods
# exist (a root partition above iso would take dp's CPUs from them), and the daemon says so.
vm_iso_pools "[kubelet]
release_grace_ms = 600000"
check "restart with iso isolated" systemctl restart cpupoold
check "iso registers with the kubelet" wait_for 60 grep -q '^registered cpupool.io/iso ' /run/peer-nri.log
check "the plugin is synchronized" wait_for 60 sh -c "cpupoolctl status | grep -q 'containers: *NRI'"
uid=0a1b2c3d-0000-4000-8000-0000000000a2
iso=$("$PEER" allocate $KD iso 1 $PODS default/nri-1/$uid/rt/pending 2>/run/peer-nri-allocate.err)
check_output "iso's device is healthy: Allocate gives CPU 3" '"CPUPOOL_CPUS":"3"' echo "$iso $(cat /run/peer-nri-allocate.err)"
dp=$("$PEER" allocate $KD dp 1 $PODS default/nri-1/$uid/app/pending 2>/run/peer-nri-allocate.err)
check_output "dp's too: CPU 2" '"CPUPOOL_CPUS":"2"' echo "$dp $(cat /run/peer-nri-allocate.err)"
pod=$(pod_start default/nri-1/$uid/guaranteed)
[ -n "$pod" ] || { fail "RunPodSandbox"; exit 1; }
slice=$(pod_slice)
rt=$(ctr_start rt "$iso")
app=$(ctr_start app "$dp")
check_output "the iso container's first process ran on CPU 3 only" '^3$' ctr_cpus rt
check_output "the dp container's on CPU 2 only" '^2$' ctr_cpus app
check_output "dp's scope keeps CPU 2" '^2$' cat "$slice/cri-containerd-$app.scope/cpuset.cpus.effective"
check_output "iso's assignment is applied" "kubelet-(core|cpu)-3 +iso +3 +1000m +applied +cgroup:kubepods.slice/kubepods-pod.*cri-containerd-$rt.scope" \
  cpupoolctl assignments
if [ -e /sys/fs/cgroup/system.slice/cpuset.cpus.exclusive ]; then
  check_output "6.7+: the iso container's scope is an isolated partition" '^isolated$' \
    cat "$slice/cri-containerd-$rt.scope/cpuset.cpus.partition"
  check_output "on CPU 3" '^3$' cat "$slice/cri-containerd-$rt.scope/cpuset.cpus.effective"
  check_output "which the kernel lists as isolated" '3' cat /sys/fs/cgroup/cpuset.cpus.isolated
  check_output "granted down the kubelet's slices" '^3$' cat /sys/fs/cgroup/kubepods.slice/cpuset.cpus.exclusive
  check_output "pool show: the isolation is not degraded" '^isolation: +(holds|not measured yet|[0-9.]+ IRQ/s)' \
    cpupoolctl pool show iso
else
  check_output "6.1: the log says why there is no partition" \
    "no isolated partition: this kernel has no cpuset.cpus.exclusive .*pool\(s\) [a-z, ]*dp" \
    journalctl -u cpupoold --no-pager -o cat
  check_output "pool show says iso is degraded, and why" '^isolation: +degraded: no isolated partition' \
    cpupoolctl pool show iso
  check_output "no partition takes CPUs from the kubelet's pods" '^0-3$' cat /sys/fs/cgroup/kubepods.slice/cpuset.cpus.effective
fi
check "StopContainer rt" ctr_stop rt 2
check "iso's assignment is gone" sh -c '! cpupoolctl assignments | grep -Eq "kubelet-(core|cpu)-3 "'
if [ -e /sys/fs/cgroup/system.slice/cpuset.cpus.exclusive ]; then
  check_output "the kubelet's slices give CPU 3 back" '^$' cat /sys/fs/cgroup/kubepods.slice/cpuset.cpus.exclusive
  check "iso's pool partition holds CPU 3 again" wait_for 10 sh -c \
    "grep -qx isolated /sys/fs/cgroup/cpupool.slice/cpupool-iso.slice/cpuset.cpus.partition"
fi
check_output "dp's container still runs on CPU 2" '^2$' cat "$slice/cri-containerd-$app.scope/cpuset.cpus.effective"
check "StopContainer app" ctr_stop app 2
check "RemoveContainer rt" ctr_remove rt
check "RemoveContainer app" ctr_remove app
check "the pod goes" pod_remove
vm_pools "[kubelet]
release_grace_ms = 600000"

# Without NRI: the poll path, and status says what it costs.
echo "[kubelet]
nri = false" >/etc/cpupoold/config.d/51-vmtest-nri.toml
check "restart without NRI" systemctl restart cpupoold
check_output "status names the poll and its delay" 'containers: +PodResources poll \(no NRI\): a container is confined up to 5 s after it starts' \
  cpupoolctl status
# The poll confines a pooled container after it starts, and the pod's sandbox with the
# containers that use no pool; a container whose scope is gone before its allocation is released
# is no error.
pods '{"pods": []}'
uid=0a1b2c3d-0000-4000-8000-0000000000a3
alloc=$("$PEER" allocate $KD dp 1 $PODS default/nri-2/$uid/app/pending 2>/run/peer-nri-allocate.err)
cpu=$(printf '%s' "$alloc" | sed -n 's/.*"CPUPOOL_CPUS":"\([0-9]*\)".*/\1/p')
pod=$(pod_start default/nri-2/$uid/besteffort)
[ -n "$pod" ] || { fail "RunPodSandbox"; exit 1; }
slice=$(pod_slice)
id=$(ctr_start app "$alloc")
check "the poll confines the container to CPU $cpu" wait_for 15 sh -c \
  "grep -qx '$cpu' $slice/cri-containerd-$id.scope/cpuset.cpus.effective"
check "and keeps the pod's sandbox off the exclusive CPUs" wait_for 15 sh -c \
  "grep -qx '0-1' $slice/cri-containerd-$pod.scope/cpuset.cpus.effective"
without=$(measure_starts 5 p)
check "create+start measured without NRI: ${without} ms (median of 5)" test -n "$without"
[ -z "$with_nri" ] || [ -z "$without" ] ||
  echo "create+start of a container without a pool, median of 5: with cpupoold's NRI plugin $with_nri ms, without NRI $without ms (ratio $(awk "BEGIN { printf \"%.2f\", $with_nri / ($without > 0 ? $without : 1) }"))" \
    >>"$RESULTS/nri-measure.txt"
since=$(date '+%Y-%m-%d %H:%M:%S')
check "StopContainer" ctr_stop app 2
check "RemoveContainer" ctr_remove app
sleep 12
check_output "its scope is gone while the allocation is held: no error in 12 s" '^0$' sh -c \
  "journalctl -u cpupoold --since '$since' --no-pager -p err -o cat | grep -c . || true"
check_fails "and no NoSuchUnit" 1 '' sh -c "journalctl -u cpupoold --since '$since' --no-pager -o cat | grep NoSuchUnit"
check "the pod goes" pod_remove
pods '{"pods": []}'

# Back as it was.
kill $peer
wait $peer 2>/dev/null
rm -f /etc/cpupoold/config.d/50-vmtest.toml /etc/cpupoold/config.d/51-vmtest-nri.toml $PODS /run/peer-nri.log \
  /run/peer-nri-allocate.err
systemctl stop cpupoold
rm -rf $KD
check "restart with the packaged configuration" systemctl restart cpupoold
