package cluster

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The hostPath and subPathExpr of UnifiedCgroupMount give each node of
// plan's layout its own cgroup, on three nodes and on one; a node whose
// cgroup is not named after it is an error, not a wrong mount.
func TestCgroupMount(t *testing.T) {
	const unified = "/sys/fs/cgroup/unified"
	for _, nodes := range []int{1, 3} {
		c := &Cluster{cgroup: "steelyard-node-42-abc", Dir: "/tmp/d", opts: Options{Nodes: nodes, NodeName: "steelyard-node"}}
		c.Nodes = c.plan()
		host, sub, err := cgroupMount(unified, c.cgroup, c.Nodes)
		if err != nil {
			t.Fatalf("%d nodes: %v", nodes, err)
		}
		if (nodes == 1) != (sub == "") {
			t.Errorf("%d nodes: subPathExpr %q", nodes, sub)
		}
		for _, n := range c.Nodes {
			// What kubelet mounts: hostPath joined with the expanded subPathExpr.
			got := filepath.Join(host, strings.ReplaceAll(sub, NodeNameVar, n.Name))
			if want := filepath.Join(unified, n.cgroup); got != want {
				t.Errorf("%d nodes: node %s mounts %s, its cgroup is %s", nodes, n.Name, got, want)
			}
		}
		c.Nodes[len(c.Nodes)-1].cgroup = "elsewhere"
		if _, _, err := cgroupMount(unified, c.cgroup, c.Nodes); err == nil {
			t.Errorf("%d nodes: a node's cgroup elsewhere: no error", nodes)
		}
	}
}

func TestParseCgroupShow(t *testing.T) {
	got, err := parseCgroupShow([]byte(`[{"id":12,"attach_type":"cgroup_inet4_connect","attach_flags":"multi","name":"sock4_connect"},{"id":13,"attach_type":"cgroup_udp4_recvmsg","attach_flags":"multi","name":"sock4_recvmsg"}]`))
	if err != nil || !slices.Equal(got, []string{"cgroup_inet4_connect:sock4_connect", "cgroup_udp4_recvmsg:sock4_recvmsg"}) {
		t.Errorf("parseCgroupShow: %q, %v", got, err)
	}
	if got, err := parseCgroupShow([]byte("\n")); err != nil || got != nil {
		t.Errorf("nothing attached: %q, %v", got, err)
	}
	if _, err := parseCgroupShow([]byte("Error: can't open cgroup")); err == nil {
		t.Error("not JSON: no error")
	}
}
