package sandbox

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestCountersParse(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c := Counters{}
	if err := c.readPairs(write("netstat", "TcpExt: SyncookiesSent ListenDrops\nTcpExt: 0 7\nIpExt: InNoRoutes\nIpExt: 3\n")); err != nil {
		t.Fatal(err)
	}
	if err := c.readFlat(write("snmp6", "Ip6InReceives                   	12\nIp6InDiscards 2\n")); err != nil {
		t.Fatal(err)
	}
	// Two CPUs; entries is a gauge and left out.
	if err := c.readConntrack(write("ct", "entries clashres found insert_failed drop\n00000005 00000001 00000000 0000000a 00000002\n00000005 00000000 00000000 00000001 00000000\n")); err != nil {
		t.Fatal(err)
	}
	want := Counters{"TcpExt SyncookiesSent": 0, "TcpExt ListenDrops": 7, "IpExt InNoRoutes": 3,
		"Ip6InReceives": 12, "Ip6InDiscards": 2,
		"conntrack clashres": 1, "conntrack found": 0, "conntrack insert_failed": 11, "conntrack drop": 2}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("parsed %v, want %v", c, want)
	}
	before := Counters{"TcpExt ListenDrops": 5, "IpExt InNoRoutes": 3, "Ip6InReceives": 1, "conntrack insert_failed": 11}
	got := c.Grown(before)
	wantGrown := []string{"Ip6InDiscards +2", "TcpExt ListenDrops +2", "conntrack clashres +1", "conntrack drop +2"}
	if !reflect.DeepEqual(got, wantGrown) {
		t.Fatalf("grown %q, want %q", got, wantGrown)
	}
}
