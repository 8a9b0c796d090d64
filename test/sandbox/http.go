package sandbox

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"time"
)

// HTTPGet fetches rawURL (plain http) from inside the namespace and returns
// the status code and body: the agent's /metrics or /healthz on the node's
// loopback, say, which the test process cannot reach from its own
// namespace. Only loopback and TrafficRange hosts are accepted.
func (n *NS) HTTPGet(rawURL string, timeout time.Duration) (int, string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return 0, "", err
	}
	ip, err := netip.ParseAddr(u.Hostname())
	if err != nil || !(ip.IsLoopback() || TrafficRange.Contains(ip)) {
		return 0, "", fmt.Errorf("sandbox: HTTP host %q: want a loopback or %s address", u.Hostname(), TrafficRange)
	}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := n.Do(func() error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	client := &http.Client{
		Timeout:   timeout,
		Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true},
	}
	resp, err := client.Get(rawURL)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}
