# systemd-analyze security: the exposure score goes to results/security.txt (and the
# host's summary). Fails above 5.0 so hardening regressions show up.
. "$(dirname "$0")/lib.sh"

systemd-analyze security --no-pager cpupoold.service >"$RESULTS/security.txt" 2>&1
score=$(sed -n 's/.*Overall exposure level for cpupoold.service: \([0-9.]*\).*/\1/p' "$RESULTS/security.txt")
if [ -z "$score" ]; then
  fail "systemd-analyze security printed no score"
  tail -n 5 "$RESULTS/security.txt" | sed 's/^/    /'
elif awk -v s="$score" 'BEGIN {exit !(s <= 5.0)}'; then
  pass "systemd-analyze security exposure $score (<= 5.0)"
else
  fail "systemd-analyze security exposure $score (> 5.0)"
fi
