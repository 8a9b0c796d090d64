package cni

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/steelyard-net/steelyard/dataplane/conntrack"
)

// hostState is what a command can change on the fake host.
type hostState struct {
	forwarding bool
	hairpin    map[string]bool
	flows      int
}

func (h *fakeHost) state() hostState {
	s := hostState{forwarding: h.forwarding, hairpin: map[string]bool{}}
	for n, l := range h.links {
		s.hairpin[n] = l.hairpin
	}
	flows, _ := h.ct.List()
	s.flows = len(flows)
	return s
}

// FuzzPlugin runs ADD, CHECK and DEL on random stdin (network configuration
// and prevResult) against the fake host: never a panic; a failure is a CNI
// error with nothing on stdout and nothing changed on the host (no partial
// write); an ADD that succeeds prints a result of the configuration's
// version.
func FuzzPlugin(f *testing.F) {
	for _, v := range SupportedVersions {
		f.Add(netConf(v, prevResult(v), ""), uint8(0), true)
		f.Add(netConf(v, prevResult(v), `, "hairpin": false, "conntrackCleanup": true`), uint8(2), true)
	}
	for _, s := range []string{
		`{"cniVersion": "0.3.1", "name": "n", "type": "steelyard-cni", "prevResult": ` + prevResult("0.4.0") + `}`,
		`{"cniVersion": "0.2.0", "name": "n", "type": "steelyard-cni", "prevResult": ` + prevResult("1.0.0") + `}`,
		`{"cniVersion": "9.9.9", "name": "n", "type": "steelyard-cni", "prevResult": ` + prevResult("1.0.0") + `}`,
		`{"cniVersion": "1.0.0", "name": "n", "type": "steelyard-cni", "prevResult": {"cniVersion": "1.0.0", "interfaces": [null, {"name": "veth1234"}], "ips": [null, {"address": "198.19.64.2/24", "interface": 7}]}}`,
		`{"cniVersion": "1.0.0", "name": "n", "type": "steelyard-cni", "prevResult": {"cniVersion": "0.1.0", "ip4": {"ip": "198.19.64.2/24"}}}`,
		`{"cniVersion": "1.0.0", "prevResult": "x"}`,
		`{"cniVersion": "1.0.0", "hairpin": "yes"}`,
		`{}`, `[]`, `null`, ``,
	} {
		for cmd := uint8(0); cmd < 3; cmd++ {
			f.Add([]byte(s), cmd, cmd == 2)
		}
	}
	f.Fuzz(func(t *testing.T, stdin []byte, cmd uint8, withNetns bool) {
		h := newFakeHost()
		h.ct = conntrack.NewFake(podFlows())
		before := h.state()
		var out, errOut bytes.Buffer
		p := &Plugin{Host: h, Stdout: &out, Stderr: &errOut}
		args := &skel.CmdArgs{ContainerID: "c1", IfName: "eth0", StdinData: stdin}
		if withNetns {
			args.Netns = podNetns
		}
		var err error
		name := []string{"ADD", "CHECK", "DEL"}[cmd%3]
		switch name {
		case "ADD":
			err = p.Add(args)
		case "CHECK":
			err = p.Check(args)
		case "DEL":
			err = p.Del(args)
		}
		after := h.state()
		if err != nil {
			var cniErr *types.Error
			if !errors.As(err, &cniErr) {
				t.Fatalf("%s: error %v (%T) is not a CNI error", name, err, err)
			}
			if out.Len() != 0 {
				t.Fatalf("%s failed (%v) but wrote to stdout: %q", name, err, out.String())
			}
			if before.forwarding != after.forwarding || !maps.Equal(before.hairpin, after.hairpin) || before.flows != after.flows {
				t.Fatalf("%s failed (%v) after changing the host: %+v -> %+v", name, err, before, after)
			}
			return
		}
		switch name {
		case "ADD":
			var v struct {
				CNIVersion string `json:"cniVersion"`
			}
			if jerr := json.Unmarshal(out.Bytes(), &v); jerr != nil {
				t.Fatalf("ADD printed a result that is not JSON: %v: %q", jerr, out.String())
			}
			conf, _ := ParseConfig(stdin)
			if conf != nil && v.CNIVersion != conf.CNIVersion {
				t.Fatalf("ADD printed a %s result for a %s configuration", v.CNIVersion, conf.CNIVersion)
			}
		default:
			if out.Len() != 0 {
				t.Fatalf("%s wrote to stdout: %q", name, out.String())
			}
		}
		if name == "CHECK" && (before.forwarding != after.forwarding || !maps.Equal(before.hairpin, after.hairpin) || before.flows != after.flows) {
			t.Fatalf("CHECK changed the host: %+v -> %+v", before, after)
		}
	})
}
