package sandbox

import "fmt"

// AddNamespace adds a bare namespace <s.Name>-<suffix> (lo up, nothing
// else) that Close deletes with the others: for harnesses that wire their
// own topology (test/node/cluster's node LAN and further nodes). Configure
// it with IPBatch.
func (s *Sandbox) AddNamespace(suffix string) (*NS, error) {
	n, err := s.newNS(suffix)
	if err != nil {
		return nil, fmt.Errorf("sandbox: namespace %s: %w", suffix, err)
	}
	s.logf("sandbox %s: namespace %s", s.Name, n.Name)
	return n, nil
}

// IPBatch runs ip commands (one per line, without "ip") inside the
// namespace in one `ip -n <name> -batch -` call; the commands can only
// reach this namespace and the ones named in them ("netns <peer>").
func (n *NS) IPBatch(lines ...string) error { return n.ipBatch(lines...) }
