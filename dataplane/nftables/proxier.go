// Package nftables is steelyard's nftables dataplane: one private table per
// IP family ("ip steelyard", "ip6 steelyard").
//
// Structure (kube-proxy's nftables mode is the model). Shared verdict maps
// send each entry point to its Service port's chains: service-ips (clusterIP,
// externalIPs, load-balancer IPs), service-nodeports (node ports on the
// addresses of the nodeport-ips set), and in the filter hooks
// no-endpoint-services / no-endpoint-nodeports (reject without endpoints,
// drop under a Local policy without local endpoints or for sources that
// loadBalancerSourceRanges do not allow). Each Service port has a split
// chain (svc-, and svl- for its local endpoints) and ext- and fw- chains
// for its external entry points. The split is one rule that DNATs through
// a weight map shared by about ten ports (weightmaps.go), drawing in the
// port's own range of it:
//
//	meta l4proto tcp dnat ip to numgen random mod N offset K map @dn-0042
//	map dn-0042 { K+0-K+9 : 198.19.1.2 . 8080, K+10-K+99 : 198.19.1.3 . 8080, (other ports') }
//
// so an endpoint or weight change rewrites the port's elements (and the
// shared hairpin set's, hairpin.go), never a chain or other Services.
// Ports with ClientIP affinity keep one ep- chain per endpoint (hairpin
// mark, affinity set update, DNAT) behind a shared verdict map:
//
//	numgen random mod N offset K vmap @wv-0042
//	map wv-0042 { K+0-K+9 : goto ep-a, K+10-K+99 : goto ep-b }
//
// Why this structure, measured with nft 1.0.6 on this machine (2 cores, load
// average 4-6 from other jobs, 10,000 Services x 10 endpoints loaded with
// one nft -f; figures in seconds):
//
//	                                  load   list ruleset   one change
//	anonymous vmap per rule (kp)     202.6       9.3           0.45
//	named interval map per Service    13.4      12.4           3.4-6.2
//	named map, "numgen . l4proto" key 13.7      15.6           0.40-0.52
//	chained numgen draws (before)     ~20       ~240           1.1
//
// nft 1.0.6 names anonymous sets by scanning the existing ones, so loading
// tens of thousands of them is quadratic. Before any element command it
// reads the elements of every non-concatenated interval set of the table
// (the SETELEM_MAYBE cache): with 10,000 plain interval maps every change
// read 100,000 elements. A concatenated key ("numgen . meta l4proto") is a
// different set type that nft does not pre-read, which brought a change
// down to the cost of reading the table's chain and set names, the floor
// of any nft command (2.7 CPU-s at 10,000 Services). So endpoint and weight
// changes skip nft: they go to the kernel as one netlink batch
// (netlink.go), 0.25 CPU-s at 10,000 Services, and so do the elements of
// the first sync (firstsync.go). With no element command left to nft on
// those paths, the key is the draw alone since 2026-12-07: the kernel
// keeps a concatenated interval map as a pipapo set, rebuilt on every
// commit, but a single-field one as an rbtree, whose commit costs what it
// changes (weightmaps.go). Only a transaction that nft runs with elements
// in it (a full resync that repairs, a partial one beyond maxNetlinkOps)
// pays the pre-read, once per nft run.
package nftables

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/reconcile"
)

var log = logrus.WithField("subsys", "nftables")

// TableName is the name of steelyard's table in each family.
const TableName = "steelyard"

// DefaultMasqueradeBit is the fwmark bit used when Config leaves it zero,
// the same as the iptables dataplane's.
const DefaultMasqueradeBit = 13

// The fixed objects of the table.
const (
	chainServices        = "services"
	chainMarkMasq        = "mark-for-masquerade"
	chainMasquerading    = "masquerading"
	chainFilterEndpoints = "filter-endpoints"
	chainReject          = "reject-chain"
	// chainRejectShare refuses a split's reject share (RejectWeight): TCP
	// with a reset, since ICMP errors for a share of every connection hit
	// the kernel's ICMP rate limit.
	chainRejectShare       = "reject-share-chain"
	mapServiceIPs          = "service-ips"
	mapServiceNodePorts    = "service-nodeports"
	mapNoEndpointServices  = "no-endpoint-services"
	mapNoEndpointNodePorts = "no-endpoint-nodeports"
	setNodePortIPs         = "nodeport-ips"
	setClusterCIDRs        = "cluster-cidrs"
	chainNATPrerouting     = "nat-prerouting"
	chainNATOutput         = "nat-output"
	chainNATPostrouting    = "nat-postrouting"
	chainFilterInput       = "filter-input"
	chainFilterForward     = "filter-forward"
	chainFilterOutput      = "filter-output"
	syncTimeout            = 5 * time.Minute
)

// BatchPorts is how many Service ports one transaction of the sync into
// an empty table writes. The first sync at 10,000 Services is then ten
// transactions, none holding the nftables lock for long
// (kubernetes#139328); later syncs are one transaction each.
var BatchPorts = 1000

// StaleDelay is how long a chain, map or set that is no longer used stays,
// unreferenced but intact, before it is flushed and deleted: packets may
// still reach it for a moment after the transaction that unlinked it (see
// sync.go). kube-proxy waits the same way because kernels before 6.2
// noticed late that a map element no longer referenced a chain; Debian
// 12's 6.1 accepts every order (TestNftablesStaleChainsKernel, make ipvs).
const StaleDelay = time.Second

// Config configures a Proxier.
type Config struct {
	// Masquerade says which new connections to a VIP are masqueraded, as
	// in every dataplane (prefixes of the other family are ignored).
	dataplane.Masquerade
	// NodeAddresses returns the node's addresses on which node ports are
	// open (--nodeport-addresses); nil or none: no node port is reachable.
	// Addresses of the other family are ignored.
	NodeAddresses func() []netip.Addr
	// Family is 4 or 6 (0: 4).
	Family int
	// LocalhostNodePorts opens node ports on 127.0.0.0/8 to the node's own
	// processes, IPv4 only (localhost.go); the caller sets route_localnet.
	LocalhostNodePorts bool
	// CountConnections counts each endpoint's new connections: the DNAT
	// maps get a counter per element (counts.go). Ports with ClientIP
	// affinity are not counted (their split is a verdict map).
	CountConnections bool
}

func (c Config) mark() string { return fmt.Sprintf("0x%x", c.markBit()) }

// markBit is the masquerade mark as a number.
func (c Config) markBit() uint32 {
	bit := c.MasqueradeBit
	if bit == 0 {
		bit = DefaultMasqueradeBit
	}
	return uint32(1) << bit
}

// fam holds the spellings that differ between the ip and ip6 families.
type fam struct {
	nfFamily knftables.Family
	ip       string // "ip" or "ip6" (address match prefix)
	addrType string // "ipv4_addr" or "ipv6_addr"
	v6       bool
}

// nfproto is the family's NFPROTO_ number (the NAT expression's family).
func (f fam) nfproto() uint32 {
	if f.v6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

func famOf(family int) fam {
	if family == 6 {
		return fam{knftables.IPv6Family, "ip6", "ipv6_addr", true}
	}
	return fam{knftables.IPv4Family, "ip", "ipv4_addr", false}
}

// Proxier programs one family's table.
type Proxier struct {
	nft knftables.Interface
	cfg Config
	f   fam

	// NodeAddresses is cfg.NodeAddresses (tests set it directly).
	NodeAddresses func() []netip.Addr

	// eng runs the Syncs (the reconcile engine): it records each Service
	// port's value as last written.
	eng *reconcile.Engine
	// rec holds the owners of the shared map elements (record.go).
	rec *record
	// hairpin counts the recorded Service ports that need each element of
	// the hairpin set (hairpin.go).
	hairpin map[hairpinKey]int
	// nodeIPs are the nodeport-ips elements written.
	nodeIPs []string
	// stale are unused objects to flush and delete once StaleDelay has passed.
	stale map[staleKey]time.Time
	// slots places each split in a shared weight map; shardMaps are the
	// shared weight maps the kernel has (weightmaps.go).
	slots     *slotTable
	shardMaps map[string]bool
	// readLive reads the live table for Explain: the kernel's (NewKernel),
	// or in unit tests the knftables Fake's.
	readLive func() (*liveTable, error)
	// tableExists, when set, tells whether the table is there (netlink,
	// for the real kernel); nil: ask nft (the fake).
	tableExists func() (bool, error)
	now         func() time.Time
	// netlink, when set, writes the transactions it can encode (the
	// real kernel); lastNetlink says whether the last one went that way.
	netlink     *netlinkWriter
	lastNetlink bool
	// lastOps is the size of the last transaction (tests).
	lastOps int
	// gen lets a full resync skip listing the table when no commit but
	// ours happened since it was last listed (generation.go).
	gen *generation
	// lastListed says whether the last full Sync listed the table (tests).
	lastListed bool
}

type staleKey struct {
	kind string // "chain", "map" or "set"
	name string
}

var _ dataplane.Dataplane = (*Proxier)(nil)

// NewProxier returns a Proxier writing through nft, an Interface bound to
// the family of cfg and TableName.
func NewProxier(nft knftables.Interface, cfg Config) *Proxier {
	if cfg.Family == 0 {
		cfg.Family = 4
	}
	return &Proxier{
		nft: nft, cfg: cfg, f: famOf(cfg.Family), NodeAddresses: cfg.NodeAddresses,
		eng:     reconcile.New(),
		rec:     newRecord(),
		hairpin: map[hairpinKey]int{},
		stale:   map[staleKey]time.Time{},
		slots:   newSlotTable(),
		now:     time.Now,
		gen:     newGeneration(),
	}
}

// NewKernel returns a Proxier over the nft binary for cfg.Family. Names are
// listed over netlink: "nft list table" of a 10,000-Service table costs
// seconds, which the full resync must not pay.
func NewKernel(cfg Config) (*Proxier, error) {
	lister, err := knftables.New(famOf(cfg.Family).nfFamily, TableName, knftables.UseNetlink)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	nft, err := newChildRunner(lister)
	if err != nil {
		return nil, err
	}
	p := NewProxier(nft, cfg)
	p.readLive = func() (*liveTable, error) { return readKernel(p.cfg.Family) }
	p.tableExists = netlinkTableExists(p.cfg.Family)
	p.netlink = newNetlinkWriter(p.cfg.Family)
	p.gen.read = readGeneration
	return p, nil
}

// readableName spells a Service port for a chain name. Built once: a
// NewReplacer per chain name was 860 MB of the 1.4 GB that the first sync
// of 10,000 Services x 10 endpoints allocated, and half its render time.
var readableName = strings.NewReplacer(":", ".", "[", "", "]", "")

// chainName returns prefix + a hash of key + a readable (trimmed) suffix.
func chainName(prefix, key, readable string) string {
	sum := sha256.Sum256([]byte(key))
	h := strings.ToLower(base32.StdEncoding.EncodeToString(sum[:])[:10])
	readable = readableName.Replace(readable)
	if len(readable) > 180 {
		readable = readable[:180]
	}
	return prefix + h + "-" + readable
}

func (p *Proxier) nodeAddrs() []string {
	if p.NodeAddresses == nil {
		return nil
	}
	var out []string
	for _, a := range p.NodeAddresses() {
		if a.Is4() == (p.cfg.Family == 4) && !a.Is4In6() {
			out = append(out, a.String())
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// PendingCleanup reports when stale objects wait for deletion: the agent
// should sync again after that long (zero: nothing waits).
func (p *Proxier) PendingCleanup() time.Duration {
	var first time.Time
	for _, t := range p.stale {
		if first.IsZero() || t.Before(first) {
			first = t
		}
	}
	if first.IsZero() {
		return 0
	}
	return max(first.Add(StaleDelay).Sub(p.now()), time.Millisecond)
}

// Cleanup implements dataplane.Dataplane: it deletes steelyard's table of
// this family, and nothing else.
func (p *Proxier) Cleanup() error {
	ctx, cancel := context.WithTimeout(context.Background(), syncTimeout)
	defer cancel()
	if _, err := p.nft.List(ctx, "chains"); err != nil {
		if isNotFound(err) {
			return nil
		}
		return fmt.Errorf("nftables: %w", err)
	}
	tx := p.nft.NewTransaction()
	tx.Delete(&knftables.Table{})
	// Listing over netlink finds no error for a missing table, so the
	// delete can be the first to say it is gone: nothing to clean then.
	if err := p.nft.Run(ctx, tx); err != nil && !isNotFound(err) {
		return fmt.Errorf("nftables: delete table: %w", err)
	}
	p.rec = newRecord()
	p.hairpin = map[hairpinKey]int{}
	p.stale = map[staleKey]time.Time{}
	p.slots, p.shardMaps = newSlotTable(), nil
	p.nodeIPs = nil
	p.eng.Reset()
	p.gen.drop()
	return nil
}
