package ingress

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
)

// Settings are the nginx settings a ConfigMap may change. Every key is
// checked; unknown keys and bad values are reported and never passed
// through (a bad value keeps the default).
type Settings struct {
	// WorkerProcesses is "auto" or 1-64 (worker_processes).
	WorkerProcesses string
	// WorkerConnections is worker_connections, 16-65535.
	WorkerConnections int
	// UpstreamKeepalive is the idle keepalive connections per upstream and
	// worker (upstream keepalive), 0-1024; 0 turns keepalive off.
	UpstreamKeepalive int
	// KeepaliveTimeout is the client keepalive_timeout.
	KeepaliveTimeout string
	// ProxyConnectTimeout, ProxyReadTimeout and ProxySendTimeout are
	// proxy_connect_timeout, proxy_read_timeout and proxy_send_timeout.
	ProxyConnectTimeout string
	ProxyReadTimeout    string
	ProxySendTimeout    string
}

// DefaultSettings are used for keys the ConfigMap does not set.
func DefaultSettings() Settings {
	return Settings{
		WorkerProcesses:     "auto",
		WorkerConnections:   16384,
		UpstreamKeepalive:   64,
		KeepaliveTimeout:    "75s",
		ProxyConnectTimeout: "5s",
		ProxyReadTimeout:    "60s",
		ProxySendTimeout:    "60s",
	}
}

// durationRE is an nginx time value: a number and an optional unit.
var durationRE = regexp.MustCompile(`^[0-9]{1,6}(ms|s|m|h)?$`)

// SettingKeys documents the ConfigMap keys, in the order of docs/l7.md.
var SettingKeys = []string{
	"worker-processes", "worker-connections", "upstream-keepalive-connections",
	"keepalive-timeout", "proxy-connect-timeout", "proxy-read-timeout", "proxy-send-timeout",
}

// ParseSettings reads a ConfigMap's data. It returns the settings (defaults
// for missing or bad keys) and one error per unknown key or bad value.
func ParseSettings(data map[string]string) (Settings, []error) {
	s := DefaultSettings()
	var errs []error
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	intIn := func(k, v string, lo, hi int, dst *int) {
		n, err := strconv.Atoi(v)
		if err != nil || n < lo || n > hi {
			errs = append(errs, fmt.Errorf("%s: %q: want an integer from %d to %d", k, v, lo, hi))
			return
		}
		*dst = n
	}
	dur := func(k, v string, dst *string) {
		if !durationRE.MatchString(v) {
			errs = append(errs, fmt.Errorf("%s: %q: want a time like 60s, 500ms, 5m", k, v))
			return
		}
		*dst = v
	}
	for _, k := range keys {
		v := data[k]
		switch k {
		case "worker-processes":
			if v == "auto" {
				s.WorkerProcesses = v
				continue
			}
			var n int
			before := len(errs)
			intIn(k, v, 1, 64, &n)
			if len(errs) == before {
				s.WorkerProcesses = strconv.Itoa(n)
			}
		case "worker-connections":
			intIn(k, v, 16, 65535, &s.WorkerConnections)
		case "upstream-keepalive-connections":
			intIn(k, v, 0, 1024, &s.UpstreamKeepalive)
		case "keepalive-timeout":
			dur(k, v, &s.KeepaliveTimeout)
		case "proxy-connect-timeout":
			dur(k, v, &s.ProxyConnectTimeout)
		case "proxy-read-timeout":
			dur(k, v, &s.ProxyReadTimeout)
		case "proxy-send-timeout":
			dur(k, v, &s.ProxySendTimeout)
		default:
			errs = append(errs, fmt.Errorf("unknown key %q ignored (known: %v)", k, SettingKeys))
		}
	}
	return s, errs
}
