# Logs reach the journal with structured fields, at the configured level (info, as shipped):
# no debug or trace lines, and nothing of the libraries' internals (zbus's tracing spans reach
# `log` in builds with the k8s feature) below warn.
. "$(dirname "$0")/lib.sh"

check_output "journal has POOL= fields" '^ +POOL=' journalctl -u cpupoold.service -o verbose --no-pager
check_output "journal has SYSLOG_IDENTIFIER=cpupoold" 'SYSLOG_IDENTIFIER=cpupoold' \
  journalctl -u cpupoold.service -o verbose --no-pager
check_output "journal has CPUPOOLD_VERSION=" 'CPUPOOLD_VERSION=' \
  journalctl -u cpupoold.service -o verbose --no-pager

# A D-Bus call of our own, so there is something for zbus to have logged.
check "busctl call ListPools" busctl --system call org.cpupool.Manager1 /org/cpupool/Manager1 \
  org.cpupool.Manager1 ListPools
journal_verbose() { journalctl -u cpupoold.service -o verbose --no-pager; }
# count_lines REGEX: how many lines of the unit's verbose journal match.
count_lines() { journal_verbose | grep -E -c -- "$1"; }
n=$(count_lines '^ +PRIORITY=7$')
if [ "$n" -eq 0 ]; then pass "no debug/trace lines (PRIORITY=7) at info"; else
  fail "no debug/trace lines (PRIORITY=7) at info: $n"
  journal_verbose | grep -E -B12 '^ +PRIORITY=7$' | tail -n 25 | sed 's/^/    /'
fi
n=$(count_lines '^ +(TARGET|CODE_MODULE)=(zbus|tracing)')
if [ "$n" -eq 0 ]; then pass "no zbus/tracing records at info"; else
  fail "no zbus/tracing records at info: $n"
  journal_verbose | grep -E -B12 '^ +(TARGET|CODE_MODULE)=(zbus|tracing)' | tail -n 25 | sed 's/^/    /'
fi
