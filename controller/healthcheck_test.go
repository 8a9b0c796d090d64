package controller

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"testing"

	"github.com/steelyard-net/steelyard/dataplane"
)

// nopDataplane accepts every State.
type nopDataplane struct{ syncs int }

func (n *nopDataplane) Sync(dataplane.State, dataplane.SyncRequest) (dataplane.SyncResult, error) {
	n.syncs++
	return dataplane.SyncResult{}, nil
}
func (n *nopDataplane) Explain() ([]dataplane.ServiceView, error) { return nil, nil }
func (n *nopDataplane) Cleanup() error                            { return nil }

func freePort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

func getHealth(t *testing.T, port uint16) (int, healthBody) {
	t.Helper()
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(int(port)) + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var body healthBody
	if err := json.Unmarshal(data, &body); err != nil {
		t.Fatalf("body %q: %v", data, err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	return resp.StatusCode, body
}

func TestHealthCheckNodePorts(t *testing.T) {
	port := freePort(t)
	local := func(ip string, w float64) dataplane.Backend {
		return dataplane.Backend{IP: netip.MustParseAddr(ip), Port: 8080, Weight: w, Ready: true, Serving: true, Local: true}
	}
	sp := dataplane.ServicePort{
		Name: dataplane.ServicePortName{Namespace: "demo", Name: "web", Port: "http"},
		VIP:  dataplane.VIP{IP: netip.MustParseAddr("198.18.0.10"), Port: 80, Protocol: dataplane.TCP},
		Backends: []dataplane.Backend{local("198.19.1.2", 1), local("198.19.1.3", 1), local("198.19.1.4", 0),
			{IP: netip.MustParseAddr("198.19.1.5"), Port: 8080, Weight: 1, Ready: true}},
		ExternalLocal: true, HealthCheckNodePort: port,
	}
	// A second port of the same Service: the same endpoints count once.
	sp2 := sp
	sp2.Name.Port, sp2.VIP.Port = "https", 443
	inner := &nopDataplane{}
	h := NewHealthChecks(inner, netip.MustParseAddr("127.0.0.1"))
	defer h.Close()
	if _, err := h.Sync(dataplane.State{Services: []dataplane.ServicePort{sp, sp2}}, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	code, body := getHealth(t, port)
	if code != http.StatusOK || body.LocalEndpoints != 2 || body.Service.Namespace != "demo" || body.Service.Name != "web" || !body.ServiceProxyHealthy {
		t.Errorf("with 2 local endpoints: %d %+v", code, body)
	}
	sp.Detach() // a dataplane's record would share the synced Backends
	for i := range sp.Backends {
		sp.Backends[i].Local = false
	}
	if _, err := h.Sync(dataplane.State{Services: []dataplane.ServicePort{sp}}, dataplane.PartialSync); err != nil {
		t.Fatal(err)
	}
	if code, body := getHealth(t, port); code != http.StatusServiceUnavailable || body.LocalEndpoints != 0 {
		t.Errorf("with no local endpoint: %d %+v", code, body)
	}
	if _, err := h.Sync(dataplane.State{}, dataplane.PartialSync); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get("http://127.0.0.1:" + strconv.Itoa(int(port)) + "/"); err == nil {
		t.Error("the port stays open after the Service is gone")
	}
	if inner.syncs != 3 {
		t.Errorf("%d syncs reached the dataplane, want 3", inner.syncs)
	}
}

func (d *nopDataplane) Counts() ([]dataplane.EndpointCount, error) { return nil, nil }
