//go:build e2e

package nftables

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	gnft "github.com/google/nftables"
)

// BenchmarkWeightMapLayouts prints, for STEELYARD_LAYOUT_SERVICES
// Service ports x 10 endpoints (default 10,000, in a sandbox's node
// namespace), what reading every weight element costs and what one
// port's change (10 elements out, 10 in, one commit) costs, for three
// layouts of the weight maps: one map per port (today's), one map for
// all ports keyed "numgen . proto . port id", and 64 such maps (a port
// in map id%64); STEELYARD_LAYOUT_SHARDS picks others, and "oN" is N
// maps keyed as today ("numgen . proto") with each port's ranges moved
// by an offset (port id/N x 1,000,000, the rule's "numgen random mod
// 1000000 offset K"), ranges over the 1,000,000 buckets as render writes
// them. Only the maps, no chains or rules: the question is the
// kernel's cost per element dump and per commit. Figures only:
//
//	go test -tags e2e -run '^$' -bench WeightMapLayouts -benchtime 1x ./dataplane/nftables/
func BenchmarkWeightMapLayouts(b *testing.B) {
	benchInSandbox(b, func(t testing.TB) { weightMapLayouts(t, servicesEnv("STEELYARD_LAYOUT_SERVICES")) }, "STEELYARD_LAYOUT_SERVICES", "STEELYARD_LAYOUT_SHARDS")
}

func weightMapLayouts(t testing.TB, n string) {
	var count int
	if _, err := fmt.Sscan(n, &count); err != nil {
		t.Fatal(err)
	}
	cpu := func() float64 {
		var self syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &self)
		sec := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
		return sec(self.Utime) + sec(self.Stime)
	}
	load := func() string {
		b, _ := os.ReadFile("/proc/loadavg")
		return strings.Join(strings.Fields(string(b))[:3], " ")
	}
	// STEELYARD_LAYOUT_SHARDS: the layouts, as a list of map counts (0:
	// one map per port); default 0,1,64.
	type layout struct {
		shards int
		offset bool // the port id as numgen's offset, not a key field
	}
	layouts := []layout{{0, false}, {1, false}, {64, false}}
	if v := os.Getenv("STEELYARD_LAYOUT_SHARDS"); v != "" {
		layouts = nil
		for _, f := range strings.Split(v, ",") {
			var k int
			off := strings.HasPrefix(f, "o")
			if _, err := fmt.Sscan(strings.TrimPrefix(f, "o"), &k); err != nil {
				t.Fatal(err)
			}
			layouts = append(layouts, layout{k, off})
		}
	}
	for _, lay := range layouts {
		shards, offset := lay.shards, lay.offset
		maps := shards
		if shards == 0 {
			maps = count
		}
		var sb strings.Builder
		fmt.Fprintf(&sb, "table ip %s {\n", TableName)
		names := make([]string, maps)
		for m := 0; m < maps; m++ {
			names[m] = fmt.Sprintf("w%d", m)
			typ := "numgen random mod 10 . meta l4proto . meta mark"
			if shards == 0 || offset {
				typ = "numgen random mod 10 . meta l4proto"
			}
			fmt.Fprintf(&sb, "map %s { typeof %s : ip daddr . tcp dport; flags interval;", names[m], typ)
			// A map with no port (more maps than ports) has no elements
			// clause: nft refuses an empty one.
			if m < count {
				sb.WriteString(" elements = {")
			}
			first := true
			for i := m; i < count; i += maps {
				for j := 0; j < 10; j++ {
					if !first {
						sb.WriteString(",")
					}
					first = false
					k := i*10 + j
					switch {
					case offset:
						lo, hi := offsetRange(i/maps, j)
						fmt.Fprintf(&sb, "%d-%d . tcp : 198.19.%d.%d . 8080", lo, hi, (k%65000)>>8, k%256)
					case shards == 0:
						fmt.Fprintf(&sb, "%d-%d . tcp : 198.19.%d.%d . 8080", j, j, (k%65000)>>8, k%256)
					default:
						fmt.Fprintf(&sb, "%d-%d . tcp . %d : 198.19.%d.%d . 8080", j, j, i, (k%65000)>>8, k%256)
					}
				}
			}
			if m < count {
				sb.WriteString("}")
			}
			sb.WriteString(" }\n")
		}
		sb.WriteString("}\n")
		cmd := exec.Command("nft", "-f", "-")
		cmd.Stdin = strings.NewReader(sb.String())
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("nft -f: %v: %s", err, out)
		}
		write := time.Since(start)

		start, c := time.Now(), cpu()
		elems, err := dumpElemsOf(unixNFProtoIPv4, names, 1)
		wall, used := time.Since(start), cpu()-c
		if err != nil {
			t.Fatal(err)
		}
		total := 0
		for _, es := range elems {
			total += len(es)
		}
		if total != count*10 {
			t.Fatalf("read %d elements, want %d", total, count*10)
		}
		changes := layoutChanges(t, shards, offset, count, names)
		layout := "one map per port"
		switch {
		case offset:
			layout = fmt.Sprintf("%d map(s) for all ports, port id as numgen offset", shards)
		case shards > 0:
			layout = fmt.Sprintf("%d map(s) for all ports", shards)
		}
		t.Logf("%d ports, %s: nft -f %.1f s; read %d elements in %d dumps: %.3f s wall, %.3f CPU-s; one port's change (10 out, 10 in, one commit) over 20 commits: median %.2f ms, max %.2f ms; load average %s",
			count, layout, write.Seconds(), total, len(names), wall.Seconds(), used, ms(changes[len(changes)/2]), ms(changes[len(changes)-1]), load())
		if out, err := exec.Command("nft", "delete", "table", "ip", TableName).CombinedOutput(); err != nil {
			t.Fatalf("nft delete table: %v: %s", err, out)
		}
	}
}

const unixNFProtoIPv4 = 2

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// offsetRange is endpoint j's range of 10 over 1,000,000 buckets, moved
// by the offset of the port with id slot in its map.
func offsetRange(slot, j int) (uint32, uint32) {
	base := uint32(slot) * 1000000
	return base + uint32(j)*100000, base + uint32(j+1)*100000 - 1
}

// layoutChanges times 20 commits that each replace a port's 10 elements
// (the middle port) through google/nftables, sorted.
func layoutChanges(t testing.TB, shards int, offset bool, count int, names []string) []time.Duration {
	c, err := gnft.New()
	if err != nil {
		t.Fatal(err)
	}
	port := count / 2
	m := names[port%len(names)]
	set, err := c.GetSetByName(&gnft.Table{Name: TableName, Family: gnft.TableFamilyIPv4}, m)
	if err != nil {
		t.Fatal(err)
	}
	// The port id's byte order as nft wrote it (meta mark: host order,
	// unless nft chose otherwise), found from the elements.
	var order binary.AppendByteOrder = binary.NativeEndian
	elems := func(gen int) []gnft.SetElement {
		var es []gnft.SetElement
		for j := 0; j < 10; j++ {
			key := func(v uint32) []byte {
				k := binary.BigEndian.AppendUint32(nil, v)
				k = append(k, 6, 0, 0, 0)
				if shards > 0 && !offset {
					k = order.AppendUint32(k, uint32(port))
				}
				return k
			}
			val := []byte{198, 19, 250, byte(gen*10 + j), 0x1f, 0x90, 0, 0}
			lo, hi := uint32(j), uint32(j)
			if offset {
				lo, hi = offsetRange(port/len(names), j)
			}
			es = append(es, gnft.SetElement{Key: key(lo), KeyEnd: key(hi), Val: val})
		}
		return es
	}
	old, err := c.GetSetElements(set)
	if err != nil {
		t.Fatal(err)
	}
	var mine []gnft.SetElement
	for _, e := range old {
		switch {
		case shards == 0:
		case offset:
			if binary.BigEndian.Uint32(e.Key)/1000000 != uint32(port/len(names)) {
				continue
			}
		case len(e.Key) != 12:
			t.Fatalf("key of %d bytes", len(e.Key))
		case binary.NativeEndian.Uint32(e.Key[8:]) == uint32(port):
		case binary.BigEndian.Uint32(e.Key[8:]) == uint32(port):
			order = binary.BigEndian
		default:
			continue
		}
		mine = append(mine, gnft.SetElement{Key: e.Key, KeyEnd: e.KeyEnd})
	}
	if len(mine) != 10 {
		t.Fatalf("port %d has %d elements in %s, want 10", port, len(mine), m)
	}
	var out []time.Duration
	for gen := 0; gen < 20; gen++ {
		if err := c.SetDeleteElements(set, mine); err != nil {
			t.Fatal(err)
		}
		next := elems(gen)
		if err := c.SetAddElements(set, next); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := c.Flush(); err != nil {
			t.Fatalf("commit %d: %v", gen, err)
		}
		out = append(out, time.Since(start))
		mine = mine[:0]
		for _, e := range next {
			mine = append(mine, gnft.SetElement{Key: e.Key, KeyEnd: e.KeyEnd})
		}
	}
	slices.Sort(out)
	return out
}
