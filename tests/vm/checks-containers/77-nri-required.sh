# The shipped containerd drop-in deploy/examples/containerd-nri-require-cpupoold.toml (NRI's
# default validator with required_plugins = ['cpupoold']): with containerd 2.x it is read from
# /etc/containerd/conf.d/ beside the guest's configuration and keeps the guest's NRI settings.
# A containerd whose NRI has the validator (2.2 and later: `containerd config dump` shows
# default_validator) refuses a container while cpupoold is stopped and creates it once cpupoold
# is back; one without it (2.0, 2.1) creates the container without cpupoold, which is what
# docs/interfaces.md says of those versions. containerd 1.7 (configuration version 2) cannot
# import a version 3 file: nothing is checked there.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/containers.sh"

ver=$(containerd --version | awk '{print $3}')
case "$ver" in
  v1.* | 1.*) echo "containerd $ver: its configuration (version 2) cannot import the drop-in (version 3)"; exit 0 ;;
esac
DROPIN=$SHARE/deploy/containerd-nri-require-cpupoold.toml
synced() { journalctl -u cpupoold --no-pager -o cat | grep -c 'NRI: synchronized with containerd'; }

n=$(synced)
since=$(date '+%Y-%m-%d %H:%M:%S')
mkdir -p /etc/containerd/conf.d
cp "$DROPIN" /etc/containerd/conf.d/90-cpupoold.toml
check "containerd $ver restarts with the drop-in in conf.d" systemctl restart containerd
check "cpupoold's plugin is synchronized with it again" wait_for 30 sh -c "test \$(journalctl -u cpupoold --no-pager -o cat | grep -c 'NRI: synchronized with containerd') -gt $n"
containerd config dump >$CRI_STATE/config-dump 2>&1
check_output "the guest's own NRI settings are kept" "socket_path = '/var/run/nri/nri.sock'" cat $CRI_STATE/config-dump
[ -e /usr/local/share/cpupool-vm/images.tar ] && images_import >/dev/null 2>&1

uid=$(cat /proc/sys/kernel/random/uuid)
pod=$(pod_start default/required-0/$uid/besteffort)
[ -n "$pod" ] || { fail "RunPodSandbox"; exit 1; }
check "cpupoold stops" systemctl stop cpupoold
# The dump shows the validator's settings only where NRI has them (0.10, containerd 2.2+).
if grep -q "required_plugins = \['cpupoold'\]" $CRI_STATE/config-dump; then
  check_fails "containerd $ver's validator refuses the container while cpupoold is away" 1 'cpupoold' ctr_start app
  check "cpupoold starts" systemctl start cpupoold
  check "and is synchronized" wait_for 30 sh -c "journalctl -u cpupoold --since '-30s' --no-pager -o cat | grep -q 'NRI: synchronized with containerd'"
  id=$(ctr_start app)
  check "the container is created and runs once cpupoold is back" wait_for 30 ctr_is CONTAINER_RUNNING app
else
  check_output "the drop-in is imported: containerd $ver says it ignores its section" 'Ignoring unknown key.*default_validator' \
    journalctl -u containerd --since "$since" --no-pager -o cat
  id=$(ctr_start app)
  check "containerd $ver has no NRI validator: the container runs without cpupoold" wait_for 30 ctr_is CONTAINER_RUNNING app
  echo "containerd $ver: no default_validator in its configuration (NRI before 0.10); the drop-in has no effect" \
    >"$RESULTS/nri-required.txt"
  check "cpupoold starts" systemctl start cpupoold
fi
check "StopContainer" ctr_stop app 2
check "RemoveContainer" ctr_remove app
check "the pod goes" pod_remove

# Back as it was.
n=$(synced)
rm -f /etc/containerd/conf.d/90-cpupoold.toml
rmdir /etc/containerd/conf.d 2>/dev/null
check "containerd restarts without the drop-in" systemctl restart containerd
check "cpupoold's plugin is synchronized again" wait_for 30 sh -c "test \$(journalctl -u cpupoold --no-pager -o cat | grep -c 'NRI: synchronized with containerd') -gt $n"
