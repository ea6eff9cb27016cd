# cpupoolctl as root, as an admin-group member and as nobody.
. "$(dirname "$0")/lib.sh"

check_output "cpupoolctl pool list (root)" 'reserved' cpupoolctl pool list
check_output "cpupoolctl pool list --json parses" '^ok$' \
  sh -c 'cpupoolctl pool list --json | python3 -c "import json, sys; json.load(sys.stdin); print(\"ok\")"'
check_output "cpupoolctl status" '.' cpupoolctl status
check_output "cpupoolctl pool list as nobody (reads are open)" 'reserved' \
  runuser -u nobody -- cpupoolctl pool list
check_fails "cpupoolctl pool assign as nobody is denied" 1 'AccessDenied' \
  runuser -u nobody -- cpupoolctl pool assign reserved --pid 1 --cpus 1
useradd --system --no-create-home --groups cpupool vmadmin 2>/dev/null
out=$(runuser -u vmadmin -- cpupoolctl pool assign reserved --pid 1 --cpus 1 2>&1)
if printf '%s\n' "$out" | grep -q AccessDenied; then
  fail "a member of group cpupool is not denied"
  printf '%s\n' "$out" | sed 's/^/    /'
else
  pass "a member of group cpupool is not denied"
fi
check_output "cpupoolctl --dbus pool list" 'reserved' cpupoolctl --dbus pool list
