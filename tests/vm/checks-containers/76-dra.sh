# The DRA driver against the real containerd 1.7 with CDI on (enable_cdi), runc, systemd and the
# kernel. The API server is the project's fake (examples/fake_apiserver.rs: there is none in any
# registry); the kubelet's part is examples/kubelet_peer.rs speaking the kubelet's real protobuf:
# the plugin watcher's registration, NodePrepareResources, then CreateContainer over the real CRI
# with the CDI device the driver answered. Checked: the pools are published as this node's
# ResourceSlice; a claim for 2 CPUs of dp is prepared in one transaction; the container's first
# process runs on those CPUs only, with the CDI spec's environment; a cpupoold restart between
# prepare and the container's start keeps the claim; a pod the claim is not reserved for gets no
# pool's CPUs; unprepare releases and removes the CDI spec; an isolated pool's claim makes its
# container an isolated partition (6.7+). 4 CPUs: reserved 0, shared web 1, exclusive dp 2-3
# (dra = true), then dp 2 and iso 3 (isolate = true).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/containers.sh"

KD=/var/lib/kubelet
FAKE=/run/fake_apiserver
[ -x $FAKE ] || cp "$SHARE/bin/fake_apiserver" $FAKE
NODE=vmtest-node
DRIVER=dra.cpupool.io

# containerd reads CDI specs only with enable_cdi (its default dirs: /etc/cdi, /var/run/cdi).
cp /etc/containerd/config.toml /run/containerd-config.toml.orig
sed -i 's|^    sandbox_image = .*|&\n    enable_cdi = true\n    cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]|' \
  /etc/containerd/config.toml
check "containerd restarts with CDI on" systemctl restart containerd

# The fake API server: commands on a FIFO, answers in a file, one line each.
rm -f /run/fake.in /run/fake.out && mkfifo /run/fake.in
$FAKE /run/fake-kubeconfig </run/fake.in >/run/fake.out 2>/run/fake.err &
fake=$!
exec 7>/run/fake.in
check "the fake API server serves" wait_for 10 grep -q '^serving ' /run/fake.out
# fake_cmd CMD: sends one command and prints its answer.
fake_cmd() {
  local n
  n=$(wc -l </run/fake.out)
  printf '%s\n' "$1" >&7
  wait_for 10 sh -c "[ \$(wc -l </run/fake.out) -gt $n ]" || return 1
  tail -n 1 /run/fake.out
}
# fake_slices: the node's ResourceSlices as the fake API server holds them.
fake_slices() { fake_cmd "slices $NODE"; }
# claim NAME UID CPUS POD_UID: a claim of dp-numa0 allocated by the scheduler, as the API holds it.
claim() {
  printf 'put-claim {"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"namespace":"default","name":"%s","uid":"%s"},"spec":{"devices":{"requests":[{"name":"cpus","exactly":{"deviceClassName":"dp.%s"}}]}},"status":{"allocation":{"devices":{"results":[{"driver":"%s","pool":"%s","device":"dp-numa0","request":"cpus","consumedCapacity":{"cpu":"%s"},"shareID":"a1b2c"}]}},"reservedFor":[{"resource":"pods","name":"%s","uid":"%s"}]}}' \
    "$1" "$2" $DRIVER $DRIVER $NODE "$3" "$1-pod" "$4"
}

# uuid: a random version-4 UUID, as the API server gives every object (the kernel makes them
# the same way); 10 in 16 begin with a digit. uuid_digit: one that does (issue 33: containerd
# refused such a claim's CDI device when its spec said cdiVersion 0.3.0).
uuid() { cat /proc/sys/kernel/random/uuid; }
uuid_digit() { while :; do u=$(uuid); case $u in [0-9]*) echo "$u"; return;; esac; done; }

# What both layouts below add: the kubelet's grace, the cluster integration at the fake.
CLUSTER="[kubelet]
release_grace_ms = 600000
[k8s]
enabled = true
kubeconfig = \"/run/fake-kubeconfig\"
node_name = \"$NODE\""
# The packaged unit opens no internet socket; the cluster integration needs one (docs/interfaces.md).
mkdir -p /etc/systemd/system/cpupoold.service.d
printf '[Service]\nRestrictAddressFamilies=AF_INET AF_INET6\n' >/etc/systemd/system/cpupoold.service.d/50-k8s.conf
systemctl daemon-reload
vm_pools "dra = true
$CLUSTER"
rm -rf $KD /var/run/cdi/cpupoold-*
mkdir -p $KD/plugins_registry $KD/plugins
check "restart cpupoold with dp served by DRA" systemctl restart cpupoold
check "the driver's registration socket appears" wait_for 30 test -S $KD/plugins_registry/$DRIVER-reg.sock
check "no device plugin serves dp" sh -c "! ls $KD/device-plugins/ 2>/dev/null | grep -q cpupoold-dp"
slices_have() { fake_slices | grep -q "$1"; }
check "the node's ResourceSlice is published" wait_for 30 slices_have dp-numa0
check_output "it lists dp-numa0 with dp's 2 CPUs, shareable" \
  '"allowMultipleAllocations":true.*"capacity":\{"cpu":\{"requestPolicy":.*"value":"2"\}\}.*"name":"dp-numa0"' fake_slices
[ -e /usr/local/share/cpupool-vm/images.tar ] && images_import >/dev/null 2>&1

# The scheduler allocated 2 CPUs of dp-numa0 to the claim `two` of the pod dra-0.
uid=$(uuid)
cuid=$(uuid_digit)
check_output "the fake API server holds the claim" '^ok$' fake_cmd "$(claim two $cuid 2 $uid)"
prep=$("$PEER" dra-prepare $KD default/two/$cuid 2>/run/peer-dra.err)
check_output "NodePrepareResources answers the claim's CDI device" "\"cdi_devices\":\[\"$DRIVER/cpu=$cuid\"\]" echo "$prep"
check_output "the claim holds CPUs 2-3 of dp, applied as one assignment" "dra-$cuid-0 +dp +2-3 " cpupoolctl assignments
check_output "its CDI spec is written where containerd reads" "CPUPOOL_CPUS=2-3" cat /var/run/cdi/cpupoold-$cuid.json
check_output "its uid begins with a digit: the spec says cdiVersion 0.5.0" '"cdiVersion": "0.5.0"' \
  cat /var/run/cdi/cpupoold-$cuid.json

# cpupoold restarts between prepare and the container's start: the claim stays.
check "restart cpupoold" systemctl restart cpupoold
check_output "the claim's CPUs are still held" "dra-$cuid-0 +dp +2-3 " cpupoolctl assignments
check_output "prepare again answers the same" "\"cdi_devices\":\[\"$DRIVER/cpu=$cuid\"\]" \
  "$PEER" dra-prepare $KD default/two/$cuid

pod=$(pod_start default/two-pod/$uid/besteffort)
[ -n "$pod" ] || { fail "RunPodSandbox"; exit 1; }
slice=$(pod_slice)
id=$(ctr_start app "$prep")
[ -n "$id" ] || { fail "CreateContainer with the CDI device: $prep $(cat /run/peer-dra.err)"; exit 1; }
check_output "the container's first process ran on CPUs 2-3 only" '^2-3$' ctr_cpus app
check_output "it has the CDI spec's CPUPOOL_CPUS" '^2-3$' ctr_env app CPUPOOL_CPUS
check_output "and CPUPOOL_CLAIM" "^$cuid\$" ctr_env app CPUPOOL_CLAIM
check_output "its scope holds CPUs 2-3" '^2-3$' cat "$slice/cri-containerd-$id.scope/cpuset.cpus.effective"
check_output "the claim's assignment is bound to its scope, applied" \
  "dra-$cuid-0 +dp +2-3 +2000m +applied +cgroup:kubepods.slice/.*cri-containerd-$id.scope" cpupoolctl assignments
second=$(ctr_start second "$prep")
check_output "a second container of the pod shares them" '^2-3$' ctr_cpus second

# Another pod's container naming the claim (its author wrote the CDI device into its spec).
check "StopContainer second" ctr_stop second 2
check "RemoveContainer second" ctr_remove second
check "StopContainer app" ctr_stop app 2
check_output "a stop releases nothing: the claim holds until unprepare" "dra-$cuid-0 +dp +2-3 " cpupoolctl assignments
check "RemoveContainer app" ctr_remove app
check "the pod goes" pod_remove
other=$(uuid)
pod=$(pod_start default/other/$other/besteffort)
id=$(ctr_start thief "$prep")
check_output "a pod the claim is not reserved for runs off the pools' exclusive CPUs" '^0-1$' ctr_cpus thief
check_output "and the log says why" 'container default/other/thief names a DRA claim in its environment, but .*: it gets none of its CPUs' \
  journalctl -u cpupoold --no-pager -o cat
check "StopContainer thief" ctr_stop thief 2
check "RemoveContainer thief" ctr_remove thief
check "the other pod goes" pod_remove

check "NodeUnprepareResources" "$PEER" dra-unprepare $KD default/two/$cuid
check "the claim's CPUs are released" sh -c "! cpupoolctl assignments | grep -q 'dra-$cuid'"
check "its CDI spec is gone" test ! -e /var/run/cdi/cpupoold-$cuid.json
check "unprepare again is done already" "$PEER" dra-unprepare $KD default/two/$cuid

# An isolated pool served by DRA beside one that is not isolated: reserved 0, web 1, dp 2, iso 3.
# Where the kernel has cpuset.cpus.exclusive (6.7), the claim's container is an isolated
# partition of its own; where it has not (6.1), none is made and the pool says why.
vm_iso_pools "dra = true
$CLUSTER"
# dp too, in a drop-in of its own (the fragments merge key by key).
printf '[pools.dp]\ndra = true\n' >/etc/cpupoold/config.d/51-vmtest-dra.toml
check "restart with iso isolated, both pools served by DRA" systemctl restart cpupoold
check "the slice lists iso-numa0" wait_for 30 slices_have iso-numa0
uid=$(uuid)
cuid=$(uuid)
check_output "the fake API server holds the iso claim" '^ok$' fake_cmd "$(claim rt $cuid 1 $uid | sed 's/dp-numa0/iso-numa0/; s/"dp\./"iso./')"
prep=$("$PEER" dra-prepare $KD default/rt/$cuid 2>/run/peer-dra.err)
check_output "the iso claim is prepared" "\"cdi_devices\":\[\"$DRIVER/cpu=$cuid\"\]" echo "$prep $(cat /run/peer-dra.err)"
pod=$(pod_start default/rt-pod/$uid/guaranteed)
[ -n "$pod" ] || { fail "RunPodSandbox"; exit 1; }
rt=$(ctr_start rt "$prep")
[ -n "$rt" ] || { fail "CreateContainer with the iso claim: $prep"; exit 1; }
check_output "the iso container's first process ran on CPU 3 only" '^3$' ctr_cpus rt
check_output "its claim is bound to its scope, applied" \
  "dra-$cuid-0 +iso +3 +1000m +applied +cgroup:kubepods.slice/.*cri-containerd-$rt.scope" cpupoolctl assignments
if [ -e /sys/fs/cgroup/system.slice/cpuset.cpus.exclusive ]; then
  check_output "6.7+: the iso claim's container is an isolated partition" '^isolated$' \
    cat "$(pod_slice)/cri-containerd-$rt.scope/cpuset.cpus.partition"
  check_output "which the kernel lists as isolated" '3' cat /sys/fs/cgroup/cpuset.cpus.isolated
else
  check_output "6.1: pool show says iso is degraded, and why" '^isolation: +degraded: no isolated partition' \
    cpupoolctl pool show iso
fi
check "StopContainer rt" ctr_stop rt 2
check "the stop unbinds the claim and keeps it" wait_for 10 sh -c \
  "cpupoolctl assignments | grep -Eq 'dra-$cuid-0 +iso +3 +1000m .*kubelet:dra-$cuid-0'"
check "RemoveContainer rt" ctr_remove rt
check "the iso pod goes" pod_remove
check "NodeUnprepareResources of the iso claim" "$PEER" dra-unprepare $KD default/rt/$cuid
check "the iso claim is released" sh -c "! cpupoolctl assignments | grep -q 'dra-$cuid'"

exec 7>&-
wait $fake 2>/dev/null
cp /run/containerd-config.toml.orig /etc/containerd/config.toml
check "containerd restarts with its own configuration" systemctl restart containerd
rm -f /etc/cpupoold/config.d/50-vmtest.toml /etc/cpupoold/config.d/51-vmtest-dra.toml /run/fake.in /run/fake.out /run/fake-kubeconfig \
  /etc/systemd/system/cpupoold.service.d/50-k8s.conf
systemctl daemon-reload
systemctl stop cpupoold
rm -rf $KD
check "restart with the packaged configuration" systemctl restart cpupoold
