# Helpers for the container checks in the Debian 13 guest: containerd 1.7 (CRI, NRI, the
# systemd cgroup driver) driven over its CRI socket by examples/kubelet_peer.rs as the kubelet
# would. Source after lib.sh: `. "$(dirname "$0")/containers.sh"`.
#
#   images_import                 import the image's OCI tar (busybox and the pause image) and
#                                 wait until the CRI manages both
#   pod_start NS/NAME/UID/QOS     the kubelet's pod slices, then RunPodSandbox; prints the
#                                 sandbox id and makes it the current pod (QOS: besteffort,
#                                 burstable, guaranteed)
#   ctr_start NAME [ENVS [CMD...]]  CreateContainer + StartContainer in the current pod; prints
#                                 the id. ENVS: a JSON object or `kubelet_peer allocate`'s output
#                                 (default {}). CMD defaults to $CTR_CMD, which prints the first
#                                 process's Cpus_allowed_list and its CPUPOOL_*/EXCLUSIVE_CPUS/
#                                 SHARED_CPUS/VMTEST_* variables, then waits for SIGTERM.
#   ctr_id NAME / ctr_status NAME (JSON) / ctr_state NAME (CONTAINER_RUNNING, ...)
#   ctr_is STATE NAME             true when the container is in STATE (for wait_for)
#   ctr_exit_code NAME
#   ctr_pid NAME                  the first process's pid on the host
#   ctr_cgroup NAME               its cgroup, /kubepods.slice/.../cri-containerd-ID.scope
#   ctr_log NAME                  what it wrote (the CRI log's text, without time and stream)
#   ctr_cpus NAME                 the Cpus_allowed_list it printed (waits up to 30 s for it)
#   ctr_env NAME VAR              the value of VAR it printed
#   ctr_stop NAME / ctr_remove NAME / pod_remove   as the kubelet stops and removes them
#   pod_slice                     the current pod's slice directory under /sys/fs/cgroup
# Ids live in $CRI_STATE, so the helpers work from $(...) too.

CRI=/run/containerd/containerd.sock
CRI_IMAGE=localhost/cpupool-busybox:1
CRI_STATE=/run/cri-vmtest
# From the guest's own disk, as in 57-kubelet.sh: from the 9p share it starts slowly.
PEER=/run/kubelet_peer
[ -x $PEER ] || cp "$SHARE/bin/kubelet_peer" $PEER
mkdir -p $CRI_STATE/ctr

# The first process (PID 1 in the container's PID namespace, so /proc/$$ is its own status)
# reports, then waits; SIGTERM (the kubelet's stop) ends it with status 0.
CTR_CMD='trap "exit 0" TERM
while read -r k v; do [ "$k" = Cpus_allowed_list: ] && echo "Cpus_allowed_list: $v"; done </proc/$$/status
env | grep -E "^(CPUPOOL_|EXCLUSIVE_CPUS|SHARED_CPUS|VMTEST_)" | sed "s/^/env /"
echo ready
sleep 100000 &
wait'

# images_import: ctr imports the tar; the CRI plugin takes the images in on the import's
# events, and labels each it manages (a RunPodSandbox before that would try to pull the pause
# image from a registry).
images_import() {
  ctr -n k8s.io images import /usr/local/share/cpupool-vm/images.tar && wait_for 30 images_managed
}
images_managed() {
  ctr -n k8s.io images ls >$CRI_STATE/images || return 1
  grep -q "^$CRI_IMAGE .*io.cri-containerd.image=managed" $CRI_STATE/images &&
    grep -q "^localhost/cpupool-pause:1 .*io.cri-containerd.image=managed" $CRI_STATE/images
}

pod_start() {
  local id
  id=$($PEER cri-run-pod $CRI "$1") || return 1
  printf '%s\n' "$1" >$CRI_STATE/pod.spec
  printf '%s\n' "$id" >$CRI_STATE/pod.id
  echo "$id"
}

pod_spec() { cat $CRI_STATE/pod.spec; }
pod_id() { cat $CRI_STATE/pod.id; }

# The slice path the kubelet's systemd driver gives the current pod.
pod_slice() {
  local spec uid
  spec=$(pod_spec)
  uid=$(echo "$spec" | cut -d/ -f3 | tr - _)
  case $(echo "$spec" | cut -d/ -f4) in
    besteffort) echo "/sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod$uid.slice" ;;
    burstable) echo "/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod$uid.slice" ;;
    guaranteed) echo "/sys/fs/cgroup/kubepods.slice/kubepods-pod$uid.slice" ;;
  esac
}

ctr_start() {
  local name=$1 envs=${2:-'{}'} id
  shift
  [ $# -eq 0 ] || shift
  [ $# -gt 0 ] || set -- sh -c "$CTR_CMD"
  id=$($PEER cri-create $CRI "$(pod_id)" "$(pod_spec)" "$name" $CRI_IMAGE "$envs" -- "$@") || return 1
  printf '%s\n' "$id" >"$CRI_STATE/ctr/$name"
  $PEER cri-start $CRI "$id" || return 1
  echo "$id"
}

ctr_id() { cat "$CRI_STATE/ctr/$1"; }
ctr_status() { $PEER cri-status $CRI "$(ctr_id "$1")"; }
# json_field KEY: a top-level string or number of the one-line JSON on stdin.
json_field() { sed -n "s/.*\"$1\":\"\{0,1\}\([^\",}]*\).*/\1/p"; }
ctr_state() { ctr_status "$1" | json_field state; }
ctr_exit_code() { ctr_status "$1" | json_field exit_code; }
ctr_is() { [ "$(ctr_state "$2")" = "$1" ]; }
ctr_pid() { ctr_status "$1" | json_field pid; }
ctr_cgroup() { sed -n 's/^0:://p' "/proc/$(ctr_pid "$1")/cgroup"; }
ctr_log() {
  local f
  f=$(ctr_status "$1" | json_field log_path)
  # CRI log lines: TIME STREAM TAG TEXT.
  cut -d' ' -f4- "$f"
}
# ctr_ready NAME: CTR_CMD has reported.
ctr_ready() { ctr_log "$1" | grep -qx ready; }
ctr_cpus() {
  wait_for 30 ctr_ready "$1" || return 1
  ctr_log "$1" | sed -n 's/^Cpus_allowed_list: //p'
}
ctr_env() { ctr_log "$1" | sed -n "s/^env $2=//p"; }

ctr_stop() { $PEER cri-stop $CRI "$(ctr_id "$1")" "${2:-10}"; }
ctr_remove() { $PEER cri-remove $CRI "$(ctr_id "$1")" && rm -f "$CRI_STATE/ctr/$1"; }
pod_remove() { $PEER cri-remove-pod $CRI "$(pod_id)" "$(pod_spec)" && rm -f $CRI_STATE/pod.id $CRI_STATE/pod.spec; }
