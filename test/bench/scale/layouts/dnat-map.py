#!/usr/bin/env python3
# Prototype layout without endpoint chains: each Service port DNATs through
# its weight map (numgen . l4proto -> address . port), the hairpin mark from
# one ip saddr . ip daddr set (docs/dataplanes.md). Not what steelyard writes.
# Usage: python3 dnat-map.py 10000 >dm.nft; in a throwaway netns: nft -f dm.nft
import sys, hashlib, base64
n=int(sys.argv[1]); m=10
def h(s): return base64.b32encode(hashlib.sha256(s.encode()).digest())[:10].decode().lower()
T="ip sy"
o=["add table %s"%T]
for c in ["mark-for-masquerade","masquerading","services"]: o.append("add chain %s %s"%(T,c))
o.append("add chain %s nat-prerouting { type nat hook prerouting priority -100 ; }"%T)
o.append("add chain %s nat-postrouting { type nat hook postrouting priority 100 ; }"%T)
o.append("add map %s service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }"%T)
o.append("add set %s hairpin { type ipv4_addr . ipv4_addr ; }"%T)
o.append("add rule %s mark-for-masquerade meta mark set meta mark or 0x4000"%T)
o.append("add rule %s masquerading ip saddr . ip daddr @hairpin jump mark-for-masquerade"%T)
o.append("add rule %s masquerading meta mark & 0x4000 == 0 return"%T)
o.append("add rule %s masquerading meta mark set meta mark xor 0x4000"%T)
o.append("add rule %s masquerading masquerade fully-random"%T)
o.append("add rule %s nat-prerouting jump services"%T)
o.append("add rule %s nat-postrouting jump masquerading"%T)
o.append("add rule %s services ip daddr . meta l4proto . th dport vmap @service-ips"%T)
for i in range(n):
  vip="198.18.%d.%d"%((i+1)>>8,(i+1)&255)
  name="bench/svc-%d/tcp/http"%i
  x=h(name); sc="svc-%s-%s"%(x,name); wm="wc-"+x
  o.append("add chain %s %s"%(T,sc))
  o.append("add map %s %s { typeof numgen random mod 1000000 . meta l4proto : ip daddr . tcp dport ; flags interval ; }"%(T,wm))
  el=[]; hp=[]; lo=0
  for j in range(m):
    k=i*m+j; ip="198.19.%d.%d"%((k%65000)>>8,(k%65000)&255); port=8080+k//65000
    hi=lo+100000-1; el.append("%d-%d . tcp : %s . %d"%(lo,hi,ip,port)); lo=hi+1
    hp.append("%s . %s"%(ip,ip))
  o.append("add element %s %s { %s }"%(T,wm," , ".join(el)))
  o.append("add element %s hairpin { %s }"%(T," , ".join(hp)))
  o.append("add rule %s %s ip daddr %s tcp dport 80 ip saddr != 198.19.0.0/16 jump mark-for-masquerade"%(T,sc,vip))
  o.append("add rule %s %s meta l4proto tcp dnat ip to numgen random mod 1000000 . meta l4proto map @%s"%(T,sc,wm))
  o.append("add element %s service-ips { %s . tcp . 80 : goto %s }"%(T,vip,sc))
print("\n".join(o))
