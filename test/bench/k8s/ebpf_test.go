package main

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"
)

// TestEBPFLayouts checks the bytes k8s-bench looks up and reads against
// the layouts of dataplane/ebpf (bpf/socklb.c): svc_key is a 16-byte
// address (IPv4 v4-mapped), the port in network order, the protocol;
// svc_val and slot_key are host-order words; backend an address and a
// network-order port.
func TestEBPFLayouts(t *testing.T) {
	k := svcKeyBytes(netip.MustParseAddr("198.18.4.7"), 80)
	want := append(netip.MustParseAddr("::ffff:198.18.4.7").AsSlice(), 0, 80, 6, 0)
	if !bytes.Equal(k, want) {
		t.Errorf("svc_key % x, want % x", k, want)
	}
	v := make([]byte, 16)
	binary.NativeEndian.PutUint32(v[0:4], 42)
	binary.NativeEndian.PutUint32(v[4:8], 10)
	if id, n, ok := svcValOf(v); !ok || id != 42 || n != 10 {
		t.Errorf("svc_val: %d %d %v", id, n, ok)
	}
	sk := slotKeyBytes(42, 3)
	if binary.NativeEndian.Uint32(sk[0:4]) != 42 || binary.NativeEndian.Uint32(sk[4:8]) != 3 {
		t.Errorf("slot_key % x", sk)
	}
	be, ok := backendOf(backendBytes("198.19.1.2", 8080))
	if !ok || be != netip.MustParseAddrPort("198.19.1.2:8080") {
		t.Errorf("backend %v %v", be, ok)
	}
}

func backendBytes(addr string, port uint16) []byte {
	b := make([]byte, 20)
	a := netip.MustParseAddr(addr).As16()
	copy(b, a[:])
	binary.BigEndian.PutUint16(b[16:18], port)
	return b
}

// fakeIter iterates fixed entries as a cilium/ebpf MapIterator does.
type fakeIter struct {
	keys, vals [][]byte
	i          int
}

func (f *fakeIter) Next(key, value any) bool {
	if f.i >= len(f.keys) {
		return false
	}
	*key.(*[]byte), *value.(*[]byte) = f.keys[f.i], f.vals[f.i]
	f.i++
	return true
}

func (f *fakeIter) Err() error { return nil }

// TestCountBackends: only live tables count, each backend once per table,
// only pod-range addresses on the endpoint port.
func TestCountBackends(t *testing.T) {
	it := &fakeIter{}
	add := func(id, slot uint32, addr string, port uint16) {
		it.keys = append(it.keys, slotKeyBytes(id, slot))
		it.vals = append(it.vals, backendBytes(addr, port))
	}
	add(1, 0, "198.19.1.1", 8080)
	add(1, 1, "198.19.1.1", 8080) // the same backend in two slots (weights)
	add(1, 2, "198.19.1.2", 8080)
	add(2, 0, "198.19.128.5", 8080)
	add(3, 0, "198.19.1.3", 8080) // an old table
	add(2, 1, "198.19.1.4", 443)  // another port
	add(2, 2, "198.18.0.1", 8080) // not a pod
	n, found, err := countBackends(it, map[uint32]bool{1: true, 2: true}, netip.MustParseAddr("198.19.128.5"))
	if err != nil || n != 3 || !found {
		t.Errorf("count %d found %v err %v, want 3 true", n, found, err)
	}
	it.i = 0
	if _, found, _ := countBackends(it, map[uint32]bool{1: true, 2: true}, netip.MustParseAddr("198.19.1.3")); found {
		t.Error("found a backend of a table no Service points at")
	}
}

func TestExplainArgv(t *testing.T) {
	bins := binaries{steelyard: "/x/bin/steelyard"}
	for _, c := range []struct {
		p    proxy
		want string
	}{
		{proxy{name: proxySteelyardEBPF, pinDir: "/p"}, "steelyard explain --mode ebpf --bpf-pin-dir PINS"},
		{proxy{name: proxySteelyardNFTables}, "steelyard explain --mode nftables"},
		{proxy{name: proxySteelyard, flavour: "legacy"}, "steelyard explain --mode iptables --iptables-mode legacy"},
		{proxy{name: proxyKubeProxyNFTables, minSync: "250ms"}, "nft list ruleset"},
		{proxy{name: proxyKubeProxyIPTables, flavour: "legacy"}, "iptables-legacy-save"},
	} {
		if got := explainName(explainArgv(bins, c.p)); got != c.want {
			t.Errorf("%s: %q, want %q", c.p.id(), got, c.want)
		}
	}
}

func TestProxyCommand(t *testing.T) {
	bins := binaries{steelyard: "/s", kubeProxy: "/kp"}
	_, args := proxy{name: proxyKubeProxyNFTables, minSync: "250ms"}.command(bins, "/kc", "")
	if got := strings.Join(args, " "); !strings.Contains(got, "--proxy-mode nftables") || !strings.HasSuffix(got, "--iptables-min-sync-period 250ms") {
		t.Errorf("kube-proxy: %s", got)
	}
	_, args = proxy{name: proxySteelyardEBPF, cgroupPath: "/cg", pinDir: "/pins"}.command(bins, "/kc", "")
	if got := strings.Join(args, " "); !strings.Contains(got, "--mode ebpf") || !strings.Contains(got, "--cgroup-path /cg --bpf-pin-dir /pins") ||
		strings.Contains(got, "min-sync") {
		t.Errorf("steelyard ebpf: %s", got)
	}
	p := proxy{name: proxyKubeProxyNFTables, minSync: "250ms"}
	if p.id() != "kube-proxy-nftables-msp250ms" || p.minSyncPeriod() != "250ms" || (proxy{name: proxySteelyardEBPF}).minSyncPeriod() != "250ms" ||
		(proxy{name: proxyKubeProxyNFTables}).minSyncPeriod() != "1s" {
		t.Errorf("%s %s", p.id(), p.minSyncPeriod())
	}
}
