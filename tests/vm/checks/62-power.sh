# Power classes on a real kernel. The guest has PM QoS (cpuN/power/pm_qos_resume_latency_us)
# but no cpufreq driver and no intel_uncore_frequency: keys that need those are refused with
# the typed "not supported on this host" error naming the key while the old configuration keeps
# running, and resume_latency_us is applied (0 is the kernel's `n/a`), read back and restored on
# removal, on stop and after a crash.
. "$(dirname "$0")/lib.sh"

qos() { cat "/sys/devices/system/cpu/cpu$1/power/pm_qos_resume_latency_us"; }
if [ ! -e /sys/devices/system/cpu/cpu2/power/pm_qos_resume_latency_us ]; then
  fail "the guest has cpu2/power/pm_qos_resume_latency_us"
  exit 0
fi
before2=$(qos 2)
before3=$(qos 3)
before1=$(qos 1)
is_qos() { [ "$(qos 2)" = "$1" ] && [ "$(qos 3)" = "$2" ]; }

# Not supported: no cpufreq driver, no uncore driver.
if [ -e /sys/devices/system/cpu/cpu2/cpufreq ]; then
  fail "the guest has no cpufreq (this check expects QEMU without it)"
else
  vm_pools '[pools.dp.power]
governor = "performance"'
  check_fails "governor without cpufreq is refused naming the key and what is missing" 1 \
    'ConfigRejected: .*pools\.dp\.power\.governor: not supported on this host: no cpufreq driver \(.*/sys/devices/system/cpu/cpu2/cpufreq. is missing\)' \
    cpupoolctl reload
  check_output "still active after the refused power class" '^active$' systemctl is-active cpupoold.service
fi
if [ ! -e /sys/devices/system/cpu/intel_uncore_frequency ]; then
  vm_pools '[pools.dp.power]
uncore_max_freq = "max"'
  check_fails "uncore without intel_uncore_frequency is refused naming the key" 1 \
    'ConfigRejected: .*pools\.dp\.power\.uncore_max_freq: not supported on this host: no intel_uncore_frequency driver' \
    cpupoolctl reload
fi
check_output "nothing was written while refused" "^$before2\$" qos 2

# resume_latency_us = 0: no idle state accepted, which the kernel's file shows as n/a.
vm_pools '[pools.dp.power]
resume_latency_us = 0'
check "reload with resume_latency_us = 0" cpupoolctl reload
check_output "CPU 2's PM QoS is n/a" '^n/a$' qos 2
check_output "CPU 3's PM QoS is n/a" '^n/a$' qos 3
check_output "CPU 1 (not in dp) is left alone" "^$before1\$" qos 1
check_output "the value found is remembered durably" 'cpu2/power/pm_qos_resume_latency_us' \
  cat /var/lib/cpupoold/power.json

# Removing the key restores what was there.
vm_pools
check "reload without the power class" cpupoolctl reload
check_output "CPU 2 restored on removal" "^$before2\$" qos 2
check_output "CPU 3 restored on removal" "^$before3\$" qos 3

# A value in µs, then a stop: restored (daemon.power_restore_on_stop defaults to true).
vm_pools '[pools.dp.power]
resume_latency_us = 20'
check "reload with resume_latency_us = 20" cpupoolctl reload
check_output "CPU 3's PM QoS is 20" '^20$' qos 3
check "systemctl stop" systemctl stop cpupoold.service
check_output "CPU 3 restored on stop" "^$before3\$" qos 3
check "systemctl start" systemctl start cpupoold.service
check_output "applied again at start" '^20$' qos 3

# A crash: the restarted daemon, whose configuration no longer sets the class, restores it.
pid=$(main_pid)
vm_pools
systemctl kill -s KILL cpupoold.service
restarted() { [ "$(systemctl is-active cpupoold.service)" = active ] && [ "$(main_pid)" != "$pid" ]; }
if wait_for 30 restarted; then pass "restarted after SIGKILL"; else fail "restarted after SIGKILL"; daemon_said; fi
if wait_for 30 is_qos "$before2" "$before3"; then
  pass "restored by the restart after the crash"
else
  fail "restored by the restart after the crash (cpu2 $(qos 2), cpu3 $(qos 3))"
  daemon_said
fi

rm -f /etc/cpupoold/config.d/50-vmtest.toml
check "reload without the test drop-in" cpupoolctl reload
