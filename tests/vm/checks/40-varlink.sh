# The varlink API with the third-party client (PyPI varlink, installed in the image).
. "$(dirname "$0")/lib.sh"

check_output "varlink.cli info" 'org\.cpupool\.Manager' python3 -m varlink.cli info "$VARLINK"
check_output "varlink.cli help org.cpupool.Manager" 'method ListPools' \
  python3 -m varlink.cli help "$VARLINK/org.cpupool.Manager"
check_output "varlink ListPools" '"reserved"' \
  python3 -m varlink.cli call "$VARLINK/org.cpupool.Manager.ListPools" '{}'
check_output "varlink ListPools as nobody (reads are open)" '"reserved"' \
  runuser -u nobody -- python3 -m varlink.cli call "$VARLINK/org.cpupool.Manager.ListPools" '{}'
check_output "installed IDL names the interface" '^interface org\.cpupool\.Manager$' \
  cat /usr/share/varlink/org.cpupool.Manager.varlink
