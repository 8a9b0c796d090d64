package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/steelyard-net/steelyard/dataplane"
)

// HealthChecks answers on each healthCheckNodePort the way kube-proxy does,
// so cloud load balancers send external traffic (externalTrafficPolicy
// Local) only to nodes that have an endpoint of the Service: 200 with the
// number of local endpoints, 503 when there is none, and a JSON body
//
//	{"service":{"namespace":"demo","name":"web"},"localEndpoints":2,"serviceProxyHealthy":true}
//
// It is a dataplane.Dataplane wrapper: after each successful Sync it opens,
// updates and closes the listeners to match the State, so the counts never
// run ahead of the rules.
type HealthChecks struct {
	dataplane.Dataplane
	// BindIP is the address the servers listen on; invalid (zero): all.
	BindIP netip.Addr

	mu      sync.Mutex
	servers map[uint16]*healthServer
}

// healthServer is one healthCheckNodePort listener.
type healthServer struct {
	srv *http.Server
	mu  sync.Mutex
	// svc is "namespace/name"; count its local endpoints.
	namespace, name string
	count           int
}

// NewHealthChecks wraps d.
func NewHealthChecks(d dataplane.Dataplane, bindIP netip.Addr) *HealthChecks {
	return &HealthChecks{Dataplane: d, BindIP: bindIP, servers: map[uint16]*healthServer{}}
}

// Sync applies s to the wrapped dataplane, then updates the health servers.
// A port that cannot be opened is logged and retried on the next Sync; it
// never fails the Sync (the rules are what matters most).
// The wrapped dataplane's result is passed on as it is: whether the Sync
// was full, when to sync again.
func (h *HealthChecks) Sync(s dataplane.State, req dataplane.SyncRequest) (dataplane.SyncResult, error) {
	res, err := h.Dataplane.Sync(s, req)
	if err != nil {
		return res, err
	}
	h.Update(s)
	return res, nil
}

// HealthCheckCounts returns, per healthCheckNodePort of s, the Service and
// its number of ready local endpoints that receive new connections
// (distinct addresses over its ports and families). Serving-and-terminating
// local endpoints still take the node's Local traffic when no local one is
// ready, but are not counted, as in kube-proxy (LocalReadyEndpoints): the
// load balancer should steer new traffic to other nodes while they drain.
func HealthCheckCounts(s dataplane.State) map[uint16]HealthCheckStatus {
	out := map[uint16]HealthCheckStatus{}
	seen := map[uint16]map[netip.Addr]bool{}
	for i := range s.Services {
		sp := &s.Services[i]
		if sp.HealthCheckNodePort == 0 {
			continue
		}
		port := sp.HealthCheckNodePort
		st := out[port]
		st.Namespace, st.Name = sp.Name.Namespace, sp.Name.Name
		if seen[port] == nil {
			seen[port] = map[netip.Addr]bool{}
		}
		for _, b := range sp.LocalBackends() {
			if b.Ready && !seen[port][b.IP] {
				seen[port][b.IP] = true
				st.LocalEndpoints++
			}
		}
		out[port] = st
	}
	return out
}

// HealthCheckStatus is what one healthCheckNodePort reports.
type HealthCheckStatus struct {
	Namespace, Name string
	LocalEndpoints  int
}

// Update opens, updates and closes the listeners to match s.
func (h *HealthChecks) Update(s dataplane.State) {
	want := HealthCheckCounts(s)
	h.mu.Lock()
	defer h.mu.Unlock()
	for port, hs := range h.servers {
		if _, ok := want[port]; !ok {
			_ = hs.srv.Close()
			delete(h.servers, port)
			log.WithField("port", port).Info("health check node port closed")
		}
	}
	for port, st := range want {
		hs := h.servers[port]
		if hs == nil {
			var err error
			if hs, err = h.listen(port); err != nil {
				log.WithError(err).WithFields(logrus.Fields{"port": port, fieldSvc: st.Namespace + "/" + st.Name}).
					Warn("cannot open health check node port; retrying on the next sync")
				continue
			}
			h.servers[port] = hs
		}
		hs.mu.Lock()
		hs.namespace, hs.name, hs.count = st.Namespace, st.Name, st.LocalEndpoints
		hs.mu.Unlock()
	}
}

func (h *HealthChecks) listen(port uint16) (*healthServer, error) {
	host := ""
	if h.BindIP.IsValid() {
		host = h.BindIP.String()
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(int(port))))
	if err != nil {
		return nil, err
	}
	hs := &healthServer{}
	hs.srv = &http.Server{Handler: hs, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := hs.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.WithError(err).WithField("port", port).Error("health check server stopped")
		}
	}()
	log.WithField("port", port).Info("health check node port open")
	return hs, nil
}

// Close closes every listener.
func (h *HealthChecks) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for port, hs := range h.servers {
		_ = hs.srv.Close()
		delete(h.servers, port)
	}
}

// CloseOnDone closes the listeners when ctx ends.
func (h *HealthChecks) CloseOnDone(ctx context.Context) {
	go func() {
		<-ctx.Done()
		h.Close()
	}()
}

// healthBody is kube-proxy's response body.
type healthBody struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

func (hs *healthServer) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	hs.mu.Lock()
	var body healthBody
	body.Service.Namespace, body.Service.Name, body.LocalEndpoints = hs.namespace, hs.name, hs.count
	hs.mu.Unlock()
	body.ServiceProxyHealthy = true
	data, err := json.Marshal(body)
	if err != nil {
		http.Error(w, fmt.Sprint(err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if body.LocalEndpoints == 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
	} else {
		w.WriteHeader(http.StatusOK)
	}
	_, _ = w.Write(data)
}
