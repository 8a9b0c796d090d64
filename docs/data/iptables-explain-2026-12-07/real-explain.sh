#!/bin/bash
# Real `steelyard explain --mode iptables --iptables-mode legacy` at 1,000 x 100
# in a network namespace of its own (removed on exit), before/after alternating.
set -u
NS=iexp-h
trap 'ip netns del $NS 2>/dev/null' EXIT
ip netns add $NS
/usr/bin/time -f "restore wall %e s, user %U s, sys %S s" ip netns exec $NS nice -n 19 iptables-legacy-restore < /tmp/iexp-save-1kx100.txt
for i in 1 2 3; do
  for v in before after; do
    echo "== $v run $i $(date -u +%T) load: $(cut -d' ' -f1-3 /proc/loadavg)"
    /usr/bin/time -f "$v wall %e s, user %U s, sys %S s, maxrss %M KiB" ip netns exec $NS nice -n 19 /tmp/steelyard-$v explain --mode iptables --iptables-mode legacy > /tmp/iexp-raw/explain-$v-$i.txt
  done
done
/usr/bin/time -f "iptables-legacy-save wall %e s, user %U s, sys %S s" ip netns exec $NS nice -n 19 iptables-legacy-save > /dev/null
