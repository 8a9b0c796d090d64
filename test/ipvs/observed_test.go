//go:build ipvsvm

package ipvs

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
	"github.com/steelyard-net/steelyard/test/viewcheck"
)

// observedConns is the connection count of the observed-share check, as
// in the host's kernel table (test/e2e/observed_test.go): the 10% share's
// standard deviation is 100*sqrt(0.1*0.9/N) = 30/sqrt(N) points, so a
// 1-point bound at 4 sigma needs N >= (4*30)^2 = 14,400; at 20,000 it is
// 4.7 sigma (IPVS's wrr is exact, but the check is the one every mode
// passes). Under TCG a sequential client made about 100 connections a
// second; 64 in flight make the 20,000 fit the VM (logged below).
const observedConns = 20000

// TestIPVSObserved: IPVS counts each destination's connections (InConns);
// explain --observed must show each endpoint's count equal to what the
// client got from it, the shares within 1 point of 10/90, and a weight
// change (UpdateDestination) must keep the counts, after which the split
// diverges from the new weights. A VM of its own (make ipvs).
func TestIPVSObserved(t *testing.T) {
	if steelyardBin == "" || examplesDir == "" {
		t.Skip("runs inside the IPVS VM (scripts/vm/test-ipvs.sh); STEELYARD_BIN and STEELYARD_EXAMPLES unset")
	}
	sb := sandbox.NewT(t, sandbox.Options{})
	client, err := sb.AddClient(netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, sb: sb, client: client, dir: t.TempDir()}
	web, err := os.ReadFile(filepath.Join(examplesDir, "web.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	f.write("web.yaml", string(web))
	names := map[string]string{"198.19.1.2": "web-1", "198.19.1.3": "web-2"}
	for ip, name := range names {
		if _, err := sb.AddPod(name, netip.MustParseAddr(ip), 8080); err != nil {
			t.Fatal(err)
		}
	}
	f.start()

	observed := func() (dataplane.ObservedView, string) {
		t.Helper()
		// IPVS copies its statistics every 2 s.
		time.Sleep(3 * time.Second)
		out, err := f.steelyard("explain", "--mode", "ipvs", "--observed", "-o", "json")
		if err != nil {
			t.Fatalf("explain --observed: %v\n%s", err, out)
		}
		text, _ := f.steelyard("explain", "--mode", "ipvs", "--observed")
		return viewcheck.FindObserved(t, out, "198.18.0.10", 80), text
	}
	if v, _ := observed(); v.Total != 0 {
		t.Fatalf("before any traffic: %d connections counted", v.Total)
	}
	start := time.Now()
	r, err := f.client.TCPConns(netip.MustParseAddrPort("198.18.0.10:80"), observedConns,
		sandbox.Load{Concurrency: 64, Timeout: 10 * time.Second, MaxDuration: 6 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d connections in %s: %s", observedConns, time.Since(start).Round(time.Millisecond), r)
	sandbox.ExpectShares(t, r, map[string]float64{"web-1": 10, "web-2": 90}, 1)
	got, text := observed()
	t.Logf("explain --mode ipvs --observed:\n%s", text)
	viewcheck.ExpectObserved(t, got, r, names, map[string]float64{"web-1": 10, "web-2": 90}, 1)

	// 50/50: the destinations' weights change in place; their counts stay,
	// and 10/90 observed against 50/50 configured diverges.
	f.write("web.yaml", strings.Replace(string(web), "web-1=10,web-2=90", "web-1=50,web-2=50", 1))
	f.waitTable("weights 50/50", 30*time.Second, func(tb map[string]map[string]dest) bool {
		vs := tb["TCP 198.18.0.10:80"]
		return vs["198.19.1.2:8080"].Weight == vs["198.19.1.3:8080"].Weight && vs["198.19.1.2:8080"].Weight > 0
	})
	after, text := observed()
	t.Logf("after the weight change:\n%s", text)
	for i, b := range after.Backends {
		if b.Count != got.Backends[i].Count {
			t.Errorf("after a weight change: %s counts %d, want %d (kept)", b.IP, b.Count, got.Backends[i].Count)
		}
	}
	if after.Verdict != dataplane.VerdictDiverges {
		t.Errorf("10/90 observed against 50/50 configured: verdict %q, want %q", after.Verdict, dataplane.VerdictDiverges)
	}
}
