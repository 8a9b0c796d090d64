package ipvs

import (
	"bufio"
	"bytes"
	"fmt"
	"os/exec"
	"strconv"
	"strings"

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
