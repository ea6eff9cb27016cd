# The container runtime the NRI checks will stand on, without anything of cpupoold's in it:
# containerd 1.7 with CRI, NRI and the systemd cgroup driver, the registry-less busybox image,
# a BestEffort and a Guaranteed pod run through the CRI as the kubelet runs them
# (examples/kubelet_peer.rs), the container's first process reporting its CPUs, its scope in
# the kubelet's slices, a containerd restart under a running container, stop and removal.
# What a container saw goes to $RESULTS/containers.txt.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/containers.sh"

check "containerd is active" wait_for 60 systemctl -q is-active containerd
check "the CRI socket is there" test -S $CRI
check "the NRI socket is there (NRI enabled)" test -S /var/run/nri/nri.sock
ctr plugins ls >$CRI_STATE/plugins 2>&1
check_output "the overlayfs snapshotter is loaded (overlay.ko of $(uname -r))" \
  'io.containerd.snapshotter.v1 +overlayfs .* ok *$' cat $CRI_STATE/plugins
check_output "the CRI plugin is loaded" 'io.containerd.grpc.v1 +cri .* ok *$' cat $CRI_STATE/plugins
check_output "the NRI plugin is loaded" 'io.containerd.nri.v1 +nri .* ok *$' cat $CRI_STATE/plugins
check "the OCI tar imports; the CRI manages its busybox and pause images" images_import

# A BestEffort pod (its UID has dashes: the slice names them with underscores).
uid=0a1b2c3d-be00-4000-8000-000000000001
uid_=$(echo $uid | tr - _)
pod=$(pod_start default/vmtest-be/$uid/besteffort)
check_output "RunPodSandbox answers a sandbox id" '^[0-9a-f]{64}$' echo "$pod"
[ -n "$pod" ] || exit 1 # the rest needs the pod
check "the kubelet's slices are active (kubepods, besteffort, the pod's)" systemctl -q is-active \
  kubepods.slice kubepods-besteffort.slice kubepods-besteffort-pod$uid_.slice
slice=$(pod_slice)
check "the sandbox runs in the pod's slice ($slice)" test -d "$slice/cri-containerd-$pod.scope"

id=$(ctr_start app '{"devices": [], "envs": {"VMTEST_ENV": "from-allocate"}}')
check_output "CreateContainer and StartContainer answer a container id" '^[0-9a-f]{64}$' echo "$id"
[ -n "$id" ] || exit 1
check "the container runs" wait_for 30 ctr_is CONTAINER_RUNNING app
cpus=$(ctr_cpus app)
check_output "its first process printed its Cpus_allowed_list" '^[0-9][0-9,-]*$' echo "$cpus"
check_output "it got the variables the device plugin would give" '^from-allocate$' ctr_env app VMTEST_ENV
status=$(ctr_status app)
check_output "containerd's cgroupsPath is the systemd driver's slice:prefix:id" \
  "\"cgroups_path\":\"kubepods-besteffort-pod$uid_.slice:cri-containerd:$id\"" echo "$status"
cg=$(ctr_cgroup app)
check_output "its first process is in the container's scope under the pod's slice" \
  "^/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod$uid_.slice/cri-containerd-$id.scope\$" echo "$cg"
check "systemd has the scope" systemctl -q is-active cri-containerd-$id.scope
if [ -n "$cg" ] && [ -e "/sys/fs/cgroup$cg/cpuset.cpus.effective" ]; then
  check_output "Cpus_allowed_list is its cgroup's cpuset.cpus.effective" "^$cpus\$" \
    cat "/sys/fs/cgroup$cg/cpuset.cpus.effective"
fi
{
  echo "kernel $(uname -r), $(containerd --version)"
  echo "besteffort container $id"
  echo "  cgroups_path $(echo "$status" | json_field cgroups_path)"
  echo "  cgroup $cg"
  echo "  Cpus_allowed_list $cpus"
  echo "  log:"
  ctr_log app | sed 's/^/    /'
} >"$RESULTS/containers.txt"

# containerd restarts under a running container: the shim keeps it; the CRI answers again.
pid=$(ctr_pid app)
check "containerd restarts" systemctl restart containerd
check "the CRI answers again, the container still running" wait_for 60 ctr_is CONTAINER_RUNNING app
check "with the same first process" test "$(ctr_pid app)" = "$pid"

check "StopContainer" ctr_stop app
check "it exited" ctr_is CONTAINER_EXITED app
check_output "with status 0 (its SIGTERM trap)" '^0$' ctr_exit_code app
check "its scope is gone" wait_for 30 sh -c "! test -e /sys/fs/cgroup$cg"
check "RemoveContainer" ctr_remove app
check_fails "it is no longer known" 1 'NotFound|not found' $PEER cri-status $CRI "$id"
check "StopPodSandbox and RemovePodSandbox; the pod's slice stopped" pod_remove
check "the pod's slice is gone" wait_for 30 sh -c "! test -e $slice"
check "the QoS slices stay, as the kubelet keeps them" systemctl -q is-active kubepods-besteffort.slice

# A Guaranteed pod: its slice is right under kubepods.slice, its container has a CPU quota.
uid=0a1b2c3d-9a00-4000-8000-000000000002
pod=$(pod_start default/vmtest-g/$uid/guaranteed)
slice=$(pod_slice)
check_output "a Guaranteed pod's slice is kubepods-pod<uid>.slice" "kubepods.slice/kubepods-pod$(echo $uid | tr - _).slice\$" echo "$slice"
id=$(ctr_start app)
cpus=$(ctr_cpus app)
check_output "its container reports Cpus_allowed_list" '^[0-9][0-9,-]*$' echo "$cpus"
cg=$(ctr_cgroup app)
check_output "its scope is in the pod's slice" "^${slice#/sys/fs/cgroup}/cri-containerd-$id.scope\$" echo "$cg"
check_output "1 CPU of quota (cpu.max)" '^100000 100000$' cat "/sys/fs/cgroup$cg/cpu.max"
{
  echo "guaranteed container $id"
  echo "  cgroup $cg"
  echo "  Cpus_allowed_list $cpus"
} >>"$RESULTS/containers.txt"
check "StopContainer" ctr_stop app
check "RemoveContainer" ctr_remove app
check "StopPodSandbox and RemovePodSandbox" pod_remove
check "the pod's slice is gone" wait_for 30 sh -c "! test -e $slice"

# Back as it was: no pods, no containers, no images of ours.
check_output "no containers are left in containerd" '^$' ctr -n k8s.io containers ls -q
ctr -n k8s.io images rm localhost/cpupool-busybox:1 localhost/cpupool-pause:1 >/dev/null 2>&1
rm -rf $CRI_STATE /var/log/pods/default_vmtest-* $PEER
