package ipvs

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/internal/execx"
)

// The ipsets that keep steelyard's rules a fixed handful however many
// Services exist: the rules match set members, and only the members change
// with Services and endpoints. An entry point is "ip,proto:port": a
// clusterIP, a node address with a node port, an external or load-balancer
// IP. kube-proxy's IPVS mode keeps the same kind of sets (KUBE-CLUSTER-IP,
// KUBE-NODE-PORT-*, KUBE-EXTERNAL-IP(-LOCAL), KUBE-LOAD-BALANCER-*).
const (
	// SetVIPs holds every clusterIP entry, with the Service port's name as
	// the member's comment ("demo/web:http", or "demo/web:http|Local" under
	// internalTrafficPolicy Local); explain reads the names from it.
	// Clients outside the cluster CIDRs are masqueraded.
	SetVIPs = "STEELYARD-IPVS-VIPS"
	// SetExternal holds the node port, external and load-balancer IP
	// entries of Cluster-policy Services ("demo/web:http|nodePort"): every
	// client is masqueraded, so replies come back through this node.
	SetExternal = "STEELYARD-IPVS-EXT"
	// SetExternalLocal holds those of externalTrafficPolicy Local Services:
	// never masqueraded, so the pod sees the client's own address.
	SetExternalLocal = "STEELYARD-IPVS-EXT-LOCAL"
	// SetDrop holds the entries whose new connections are dropped: a Local
	// policy with no local endpoint (IPVS alone would refuse them).
	SetDrop = "STEELYARD-IPVS-DROP"
	// SetFirewall holds the load-balancer entries restricted by
	// loadBalancerSourceRanges; SetSourceRanges the allowed
	// "ip,proto:port,cidr", with the range's position as the comment.
	SetFirewall     = "STEELYARD-IPVS-LB-FW"
	SetSourceRanges = "STEELYARD-IPVS-LB-SRC"
	// SetLoopback holds "ip,proto:port,ip" for every destination, so that a
	// pod that reaches itself through its VIP (hairpin) is masqueraded.
	SetLoopback = "STEELYARD-IPVS-LOOP"
)

// setTypes are the ipset types of the sets, in creation order (cleanup
// destroys them in the same order, after the rules that use them).
var setTypes = []struct {
	name, typ string
	comments  bool
}{
	{SetVIPs, "hash:ip,port comment", true},
	{SetExternal, "hash:ip,port comment", true},
	{SetExternalLocal, "hash:ip,port comment", true},
	{SetDrop, "hash:ip,port", false},
	{SetFirewall, "hash:ip,port", false},
	{SetSourceRanges, "hash:ip,port,net comment", true},
	{SetLoopback, "hash:ip,port,ip", false},
}

// setNames returns the names of setTypes.
func setNames() []string {
	out := make([]string, len(setTypes))
	for i, st := range setTypes {
		out[i] = st.name
	}
	return out
}

// SetEntry is one member of an ipset.
type SetEntry struct {
	Member  string
	Comment string
}

// Sets is the narrow view of ipset the proxier needs. The real one runs the
// ipset tool; FakeSets keeps them in memory and enforces ipset's rules.
type Sets interface {
	// Restore runs "ipset restore -exist" on text: create, add, del and
	// destroy lines, without the "ipset" word.
	Restore(text string) error
	// Entries returns the members of set name; none when it does not exist.
	Entries(name string) ([]SetEntry, error)
	// List returns the members of each of names that exists, read at once
	// (one "ipset save": each ipset process costs, a lot in a VM).
	List(names []string) (map[string][]SetEntry, error)
	// Destroy removes set name if it exists.
	Destroy(name string) error
}

type ipsetTool struct{ path string }

// NewSets returns the real Sets, which runs the ipset tool.
func NewSets() (Sets, error) {
	p, err := exec.LookPath("ipset")
	if err != nil {
		return nil, fmt.Errorf("ipset tool not found (install the ipset package): %w", err)
	}
	return &ipsetTool{path: p}, nil
}

func (t *ipsetTool) run(stdin string, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	// execx: no ipset child outlives the agent or runs on after SIGTERM.
	cmd := execx.Command(t.path, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(stdin), &stdout, &stderr
	if err := execx.Run(cmd); err != nil {
		return nil, fmt.Errorf("ipset %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

func (t *ipsetTool) Restore(text string) error {
	_, err := t.run(text, "restore", "-exist")
	return err
}

func (t *ipsetTool) Entries(name string) ([]SetEntry, error) {
	out, err := t.run("", "save", name)
	if err != nil {
		if strings.Contains(err.Error(), "does not exist") {
			return nil, nil
		}
		return nil, err
	}
	return parseSave(name, out)
}

func (t *ipsetTool) Destroy(name string) error {
	_, err := t.run("", "destroy", name)
	if err != nil && strings.Contains(err.Error(), "does not exist") {
		return nil
	}
	return err
}

func (t *ipsetTool) List(names []string) (map[string][]SetEntry, error) {
	out, err := t.run("", "save")
	if err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	return parseSaveSets(want, out)
}

// parseSave reads "add NAME MEMBER [comment "text"]" lines of ipset save.
func parseSave(name string, out []byte) ([]SetEntry, error) {
	m, err := parseSaveSets(map[string]bool{name: true}, out)
	return m[name], err
}

// parseSaveSets reads the members of the sets in want from ipset save.
func parseSaveSets(want map[string]bool, out []byte) (map[string][]SetEntry, error) {
	entries := map[string][]SetEntry{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<16), 1<<24)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 || f[0] != "add" || !want[f[1]] {
			continue
		}
		name := f[1]
		e := SetEntry{Member: f[2]}
		if i := strings.Index(sc.Text(), " comment "); i >= 0 {
			c := strings.TrimSpace(sc.Text()[i+len(" comment "):])
			if u, err := strconv.Unquote(c); err == nil {
				c = u
			}
			e.Comment = c
		}
		entries[name] = append(entries[name], e)
	}
	return entries, sc.Err()
}

// vipMember is the SetVIPs member of a VIP: "198.18.0.10,tcp:80".
func vipMember(v dataplane.VIP) string {
	return fmt.Sprintf("%s,%s:%d", v.IP, v.Protocol.Lower(), v.Port)
}

// parseVIPMember reads a SetVIPs member back.
func parseVIPMember(m string) (dataplane.VIP, bool) {
	ipS, rest, ok := strings.Cut(m, ",")
	if !ok {
		return dataplane.VIP{}, false
	}
	protoS, portS, ok := strings.Cut(rest, ":")
	if !ok {
		return dataplane.VIP{}, false
	}
	ip, err := netip.ParseAddr(ipS)
	if err != nil {
		return dataplane.VIP{}, false
	}
	var port uint16
	if _, err := fmt.Sscanf(portS, "%d", &port); err != nil {
		return dataplane.VIP{}, false
	}
	return dataplane.VIP{IP: ip, Port: port, Protocol: dataplane.Protocol(strings.ToUpper(protoS))}, true
}

// loopMember is the SetLoopback member of a destination of vip.
func loopMember(vip dataplane.VIP, d netip.AddrPort) string {
	return fmt.Sprintf("%s,%s:%d,%s", d.Addr(), vip.Protocol.Lower(), d.Port(), d.Addr())
}

// members returns the set members of an entry point, by set, with their
// comments; the loopback members (per destination) are left to the caller.
func (w *wantService) members() map[string]map[string]string {
	vip := w.vs.Key()
	m := vipMember(vip)
	out := map[string]map[string]string{}
	add := func(set, member, comment string) {
		if out[set] == nil {
			out[set] = map[string]string{}
		}
		out[set][member] = comment
	}
	switch {
	case w.meta.entry == dataplane.EntryClusterIP:
		add(SetVIPs, m, w.meta.comment(w.name))
	case w.meta.local:
		add(SetExternalLocal, m, w.meta.comment(w.name))
	default:
		add(SetExternal, m, w.meta.comment(w.name))
	}
	if w.meta.drop {
		add(SetDrop, m, "")
	}
	if w.meta.ranges != "" {
		add(SetFirewall, m, "")
		for i, r := range strings.Split(w.meta.ranges, ",") {
			// The comment keeps the range's position: explain shows them
			// in the Service's order.
			add(SetSourceRanges, m+","+r, fmt.Sprint(i))
		}
	}
	return out
}

// syncSets makes the sets hold exactly the desired members, in one ipset
// restore. Draining destinations keep their loopback member.
func (p *Proxier) syncSets(want map[dataplane.VIP]*wantService, full bool) error {
	wantM, haveM := map[string]map[string]string{}, map[string]map[string]string{}
	for _, st := range setTypes {
		wantM[st.name], haveM[st.name] = map[string]string{}, map[string]string{}
	}
	addWant := func(vip dataplane.VIP, w *wantService) {
		for set, ms := range w.members() {
			for m, c := range ms {
				wantM[set][m] = c
			}
		}
		for addr := range w.dests {
			wantM[SetLoopback][loopMember(vip, addr)] = ""
		}
		for addr := range p.draining[vip] {
			wantM[SetLoopback][loopMember(vip, addr)] = ""
		}
	}
	addHave := func(vip dataplane.VIP, a *liveService) {
		if a.want != nil {
			for set, ms := range a.want.members() {
				for m, c := range ms {
					haveM[set][m] = c
				}
			}
		}
		for addr := range a.dests {
			haveM[SetLoopback][loopMember(vip, addr)] = ""
		}
	}
	if full {
		for vip, w := range want {
			addWant(vip, w)
		}
		all, err := p.sets.List(setNames())
		if err != nil {
			return err
		}
		for _, st := range setTypes {
			for _, e := range all[st.name] {
				haveM[st.name][e.Member] = e.Comment
			}
		}
	} else {
		// Only the Services that changed since the last Sync.
		for vip, w := range want {
			a := p.applied[vip]
			if a != nil && len(p.draining[vip]) == 0 && p.unchanged(vip, a, w) {
				continue
			}
			addWant(vip, w)
			if a != nil {
				addHave(vip, a)
			}
		}
		for vip, a := range p.applied {
			if want[vip] == nil {
				addHave(vip, a)
			}
		}
		// A loopback member is per destination, and a destination can
		// serve several entry points (a node port and its clusterIP, two
		// Services over one pod port): keep the members that an entry
		// this partial Sync did not look at still needs.
		var gone []string
		for m := range haveM[SetLoopback] {
			if _, ok := wantM[SetLoopback][m]; !ok {
				gone = append(gone, m)
			}
		}
		if len(gone) > 0 {
			needed := map[string]bool{}
			for vip, w := range want {
				for addr := range w.dests {
					needed[loopMember(vip, addr)] = true
				}
			}
			for _, m := range gone {
				if needed[m] {
					wantM[SetLoopback][m] = ""
				}
			}
		}
	}
	var b strings.Builder
	for _, st := range setTypes {
		diffSet(&b, st.name, wantM[st.name], haveM[st.name], st.comments)
	}
	if b.Len() == 0 {
		return nil
	}
	if err := p.sets.Restore(b.String()); err != nil {
		return fmt.Errorf("update ipsets: %w", err)
	}
	return nil
}

func diffSet(b *strings.Builder, set string, want, have map[string]string, comments bool) {
	for _, m := range sortedKeys(have) {
		if c, ok := want[m]; !ok || (comments && c != have[m]) {
			fmt.Fprintf(b, "del %s %s\n", set, m)
		}
	}
	for _, m := range sortedKeys(want) {
		if c, ok := have[m]; ok && (!comments || c == want[m]) {
			continue
		}
		if comments {
			fmt.Fprintf(b, "add %s %s comment %q\n", set, m, want[m])
		} else {
			fmt.Fprintf(b, "add %s %s\n", set, m)
		}
	}
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
