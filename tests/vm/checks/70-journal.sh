# Logs reach the journal with structured fields.
. "$(dirname "$0")/lib.sh"

check_output "journal has POOL= fields" '^ +POOL=' journalctl -u cpupoold.service -o verbose --no-pager
check_output "journal has SYSLOG_IDENTIFIER=cpupoold" 'SYSLOG_IDENTIFIER=cpupoold' \
  journalctl -u cpupoold.service -o verbose --no-pager
check_output "journal has CPUPOOLD_VERSION=" 'CPUPOOLD_VERSION=' \
  journalctl -u cpupoold.service -o verbose --no-pager
