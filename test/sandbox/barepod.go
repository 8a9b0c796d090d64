package sandbox

import (
	"fmt"
	"regexp"
)

// Path is the namespace's file (/run/netns/<name>), as CNI_NETNS wants it.
func (n *NS) Path() string { return n.path }

// AddBarePod adds a pod namespace with only lo, and starts its TCP and UDP
// servers on ports (bound to every address, so they answer on whatever
// interface a CNI plugin adds later). The pod has no address yet: set
// Pod.IP once the network is set up. Close deletes it like any pod.
func (s *Sandbox) AddBarePod(name string, ports ...uint16) (*Pod, error) {
	if !regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$`).MatchString(name) {
		return nil, fmt.Errorf("sandbox: pod name %q: want a DNS label", name)
	}
	s.mu.Lock()
	if _, dup := s.pods[name]; dup {
		s.mu.Unlock()
		return nil, fmt.Errorf("sandbox: pod %s exists", name)
	}
	s.mu.Unlock()
	n, err := s.newNS("pod-" + name)
	if err != nil {
		return nil, err
	}
	p := &Pod{Name: name, Ports: append([]uint16(nil), ports...), NS: n}
	if err := p.start(); err != nil {
		p.stop()
		return nil, fmt.Errorf("sandbox: pod %s: %w", name, err)
	}
	s.mu.Lock()
	s.pods[name] = p
	s.podOrder = append(s.podOrder, p)
	s.mu.Unlock()
	s.logf("sandbox %s: bare pod %s ports %v in %s", s.Name, name, ports, n.Name)
	return p, nil
}

// RemoveBarePod stops the servers of a pod made by AddBarePod and deletes
// its namespace (and with it the interfaces a CNI plugin put there), as a
// container runtime does after CNI DEL.
func (s *Sandbox) RemoveBarePod(name string) error {
	s.mu.Lock()
	p := s.pods[name]
	if p == nil || p.Veth != "" {
		s.mu.Unlock()
		return fmt.Errorf("sandbox: no bare pod %s", name)
	}
	delete(s.pods, name)
	for i, q := range s.podOrder {
		if q == p {
			s.podOrder = append(s.podOrder[:i], s.podOrder[i+1:]...)
			break
		}
	}
	for i, n := range s.namespaces {
		if n == p.NS {
			s.namespaces = append(s.namespaces[:i], s.namespaces[i+1:]...)
			break
		}
	}
	s.mu.Unlock()
	p.stop()
	return p.NS.delete()
}
