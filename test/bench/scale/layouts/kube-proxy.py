#!/usr/bin/env python3
# kube-proxy nftables-mode layout (service-/endpoint- chains, an anonymous
# numgen vmap per Service port) at N Services x 10 endpoints, as nft -f input,
# for comparing listing costs with steelyard's (docs/dataplanes.md).
# Usage: python3 kube-proxy.py 10000 >kp.nft; in a throwaway netns: nft -f kp.nft
import sys, hashlib, base64
n=int(sys.argv[1]); m=10
def h(s): return base64.b32encode(hashlib.sha256(s.encode()).digest())[:8].decode()
T="ip kube-proxy"
o=["add table %s { comment \"rules for kube-proxy\" ; }"%T]
for c in ["mark-for-masquerade","masquerading","services"]: o.append("add chain %s %s"%(T,c))
o.append("add chain %s nat-prerouting { type nat hook prerouting priority -100 ; }"%T)
o.append("add chain %s nat-output { type nat hook output priority -100 ; }"%T)
o.append("add chain %s nat-postrouting { type nat hook postrouting priority 100 ; }"%T)
o.append("add set %s cluster-ips { type ipv4_addr ; }"%T)
o.append("add map %s service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }"%T)
o.append("add rule %s mark-for-masquerade meta mark set meta mark or 0x4000"%T)
o.append("add rule %s masquerading meta mark & 0x4000 == 0 return"%T)
o.append("add rule %s masquerading meta mark set meta mark xor 0x4000"%T)
o.append("add rule %s masquerading masquerade fully-random"%T)
o.append("add rule %s nat-prerouting jump services"%T)
o.append("add rule %s nat-output jump services"%T)
o.append("add rule %s nat-postrouting jump masquerading"%T)
o.append("add rule %s services ip daddr . meta l4proto . th dport vmap @service-ips"%T)
chains=[];rules=[];elems=[]
for i in range(n):
  vip="198.18.%d.%d"%((i+1)>>8,(i+1)&255)
  name="bench/svc-%d/tcp/http"%i
  sc="service-%s-%s"%(h(name),name)
  eps=[]
  for j in range(m):
    k=i*m+j; ip="198.19.%d.%d"%((k%65000)>>8,(k%65000)&255); port=8080+k//65000
    ec="endpoint-%s-%s__%s/%d"%(h(name+ip),name,ip,port)
    eps.append(ec); chains.append(ec)
    rules.append("add rule %s %s ip saddr %s jump mark-for-masquerade"%(T,ec,ip))
    rules.append("add rule %s %s meta l4proto tcp dnat to %s:%d"%(T,ec,ip,port))
  chains.append(sc)
  vm=" , ".join("%d : goto %s"%(j,e) for j,e in enumerate(eps))
  rules.append("add rule %s %s ip daddr %s tcp dport 80 ip saddr != 198.19.0.0/16 jump mark-for-masquerade"%(T,sc,vip))
  rules.append("add rule %s %s numgen random mod %d vmap { %s }"%(T,sc,m,vm))
  elems.append("add element %s cluster-ips { %s }"%(T,vip))
  elems.append("add element %s service-ips { %s . tcp . 80 : goto %s }"%(T,vip,sc))
o+=["add chain %s %s"%(T,c) for c in chains]+rules+elems
print("\n".join(o))
