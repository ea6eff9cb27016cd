# The NRI plugin against the real containerd 1.7 (NRI 0.6.1, systemd cgroup driver), with the
# kubelet's part played by examples/kubelet_peer.rs: Allocate over the device-plugin socket,
# then RunPodSandbox / CreateContainer / StartContainer over the real CRI with the environment
# Allocate gave. Checked: the container's first process runs on its allocated CPU (it prints
# its own Cpus_allowed_list), its scope holds it, the books say so; a container without a pool
# and the pod's sandbox are kept off the exclusive CPUs from their start; a containerd restart
# and a cpupoold restart keep it; the stop releases at once; without NRI status says which path.
# 4 CPUs: reserved 0, shared web 1, exclusive dp 2-3.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/containers.sh"

KD=/var/lib/kubelet
PODS=/run/kubelet-peer-pods.json
pods() { printf '%s\n' "$1" >$PODS.tmp && mv $PODS.tmp $PODS; }
nri_logs() { journalctl -u cpupoold --no-pager -o cat | grep 'NRI: '; }

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
check "the pod goes" pod_remove

# An isolated dp: its partition takes CPUs 2-3 from kubepods.slice (before 6.7 cpupool.slice is a
# root partition and takes every pool's), so no container could run there: dp's devices are
# Unhealthy, the log names the pool, and the kubelet has nothing to allocate.
vm_pools "isolate = true
[kubelet]
release_grace_ms = 600000"
check "restart with dp isolated" systemctl restart cpupoold
check_output "the pool's partition is isolated" 'dp .*isolated' cpupoolctl pool list
check "the log says the pod cgroup lacks dp's CPUs" wait_for 30 sh -c \
  "journalctl -u cpupoold --no-pager -o cat | grep -q \"pod cgroup does not have CPUs .* of pool(s) [a-z, ]*dp.*Unhealthy\""
check_fails "Allocate finds no healthy dp device" 1 'Error' "$PEER" allocate $KD dp 1 $PODS default/nri-1/u1/app/pending
vm_pools "[kubelet]
release_grace_ms = 600000"

# Without NRI: the poll path, and status says what it costs.
echo "[kubelet]
nri = false" >/etc/cpupoold/config.d/51-vmtest-nri.toml
check "restart without NRI" systemctl restart cpupoold
check_output "status names the poll and its delay" 'containers: +PodResources poll \(no NRI\): a container is confined up to 5 s after it starts' \
  cpupoolctl status

# Back as it was.
kill $peer
wait $peer 2>/dev/null
rm -f /etc/cpupoold/config.d/50-vmtest.toml /etc/cpupoold/config.d/51-vmtest-nri.toml $PODS /run/peer-nri.log \
  /run/peer-nri-allocate.err
systemctl stop cpupoold
rm -rf $KD
check "restart with the packaged configuration" systemctl restart cpupoold
