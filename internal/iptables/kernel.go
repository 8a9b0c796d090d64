package iptables

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"strings"

	goipt "github.com/coreos/go-iptables/iptables"

	"github.com/steelyard-net/steelyard/internal/execx"
)

// Interface is the narrow view of the kernel the iptables dataplane needs.
// The real one runs the iptables tools of the host's flavour (nft or legacy);
// Fake keeps state in memory and enforces the kernel's rules.
type Interface interface {
	// SaveAll returns iptables-save output for every table.
	SaveAll() ([]byte, error)
	// SaveCounters returns iptables-save -c output for table t: each rule
	// after its own "[packets:bytes]" counter.
	SaveCounters(t Table) ([]byte, error)
	// Restore feeds data to iptables-restore --noflush: all of it applies or
	// none of it does.
	Restore(data []byte) error
	// EnsureChain creates chain c in table t if it is missing.
	EnsureChain(t Table, c Chain) error
	// EnsureRule inserts rule (args) at the top of built-in chain c unless it
	// is already there.
	EnsureRule(t Table, c Chain, args ...string) error
	// HasRule reports whether chain c holds rule (args); a missing chain
	// holds nothing.
	HasRule(t Table, c Chain, args ...string) (bool, error)
	// DeleteRule deletes rule (args) from chain c if it is there.
	DeleteRule(t Table, c Chain, args ...string) error
	// DeleteChain flushes and deletes chain c if it exists.
	DeleteChain(t Table, c Chain) error
}

// Mode is the iptables flavour: the nf_tables-backed tools or the legacy
// ones. Both can hold rules at once and do not see each other's, so
// steelyard must use the flavour the rest of the host uses.
type Mode string

// The iptables flavours.
const (
	ModeAuto   Mode = "auto"
	ModeNFT    Mode = "nft"
	ModeLegacy Mode = "legacy"
)

// runner is the real Interface: go-iptables for the few single-rule
// operations, iptables-save/iptables-restore for the bulk.
type runner struct {
	mode    Mode
	ipt     *goipt.IPTables
	save    string
	restore string
}

var _ Interface = (*runner)(nil)

// New returns the real Interface for mode; ModeAuto detects the host's.
func New(mode Mode) (Interface, Mode, error) {
	if mode == ModeAuto || mode == "" {
		mode = Detect()
	}
	if mode != ModeNFT && mode != ModeLegacy {
		return nil, "", fmt.Errorf("unknown iptables mode %q (want auto, nft or legacy)", mode)
	}
	ipt, err := goipt.New(goipt.Path(tool(mode, "iptables")), goipt.Timeout(5))
	if err != nil {
		return nil, "", fmt.Errorf("iptables (%s): %w", mode, err)
	}
	return &runner{
		mode:    mode,
		ipt:     ipt,
		save:    tool(mode, "iptables-save"),
		restore: tool(mode, "iptables-restore"),
	}, mode, nil
}

// New6 returns the real Interface for IPv6 (ip6tables, ip6tables-save,
// ip6tables-restore) in mode, which must be ModeNFT or ModeLegacy (the
// flavour New picked for IPv4: both families use the same one).
func New6(mode Mode) (Interface, error) {
	if mode != ModeNFT && mode != ModeLegacy {
		return nil, fmt.Errorf("unknown iptables mode %q (want nft or legacy)", mode)
	}
	ipt, err := goipt.New(goipt.IPFamily(goipt.ProtocolIPv6), goipt.Path(tool6(mode, "ip6tables")), goipt.Timeout(5))
	if err != nil {
		return nil, fmt.Errorf("ip6tables (%s): %w", mode, err)
	}
	return &runner{
		mode:    mode,
		ipt:     ipt,
		save:    tool6(mode, "ip6tables-save"),
		restore: tool6(mode, "ip6tables-restore"),
	}, nil
}

// tool6 is tool for the ip6tables family of commands.
func tool6(mode Mode, name string) string {
	flavoured := strings.Replace(name, "ip6tables", "ip6tables-"+string(mode), 1)
	if p, err := exec.LookPath(flavoured); err == nil {
		return p
	}
	return name
}

// tool returns the flavoured tool ("iptables-nft-save") when the host has
// it, else the plain name.
func tool(mode Mode, name string) string {
	flavoured := strings.Replace(name, "iptables", "iptables-"+string(mode), 1)
	if p, err := exec.LookPath(flavoured); err == nil {
		return p
	}
	return name
}

// Detect picks the flavour the host already uses: the one holding more
// rules (steelyard's and kube-proxy's count most), else the flavour the
// plain "iptables" command runs. This follows the iptables-wrapper logic
// that Kubernetes images use.
func Detect() Mode {
	count := func(m Mode) int {
		name := "iptables-" + string(m) + "-save"
		if _, err := exec.LookPath(name); err != nil {
			return -1
		}
		out, err := exec.Command(name).Output()
		if err != nil {
			return -1
		}
		n := 0
		for _, l := range strings.Split(string(out), "\n") {
			switch {
			case strings.Contains(l, ChainPrefix), strings.Contains(l, "KUBE-"):
				n += 100
			case strings.HasPrefix(l, "-A "):
				n++
			}
		}
		return n
	}
	nft, legacy := count(ModeNFT), count(ModeLegacy)
	switch {
	case legacy > nft && legacy > 0:
		return ModeLegacy
	case nft > legacy && nft > 0:
		return ModeNFT
	}
	out, _ := exec.Command("iptables", "--version").Output()
	if strings.Contains(string(out), "legacy") {
		return ModeLegacy
	}
	return ModeNFT
}

func (r *runner) SaveAll() ([]byte, error) {
	var stdout, stderr bytes.Buffer
	// execx: killed on shutdown and with the agent (a save of 10,000
	// Services takes about a second).
	cmd := execx.Command(r.save)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := execx.Run(cmd); err != nil {
		return nil, fmt.Errorf("%s: %w: %s", r.save, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

func (r *runner) SaveCounters(t Table) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := execx.Command(r.save, "-c", "-t", string(t))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := execx.Run(cmd); err != nil {
		return nil, fmt.Errorf("%s -c -t %s: %w: %s", r.save, t, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

func (r *runner) Restore(data []byte) error {
	var stderr bytes.Buffer
	// execx: a restore of 10,000 Services takes seconds with
	// iptables-nft; on shutdown it is killed, which commits nothing.
	cmd := execx.Command(r.restore, "--noflush", "--wait", "5")
	cmd.Stdin, cmd.Stderr = bytes.NewReader(data), &stderr
	if err := execx.Run(cmd); err != nil {
		return fmt.Errorf("%s: %w: %s", r.restore, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

func (r *runner) EnsureChain(t Table, c Chain) error {
	ok, err := r.ipt.ChainExists(string(t), string(c))
	if err != nil {
		return err
	}
	if ok {
		return nil
	}
	err = r.ipt.NewChain(string(t), string(c))
	var e *goipt.Error
	if errors.As(err, &e) && e.ExitStatus() == 1 {
		// Created by someone else meanwhile.
		return nil
	}
	return err
}

func (r *runner) EnsureRule(t Table, c Chain, args ...string) error {
	ok, err := r.ipt.Exists(string(t), string(c), args...)
	if err != nil {
		return err
	}
	if ok {
		return nil
	}
	return r.ipt.Insert(string(t), string(c), 1, args...)
}

func (r *runner) HasRule(t Table, c Chain, args ...string) (bool, error) {
	ok, err := r.ipt.Exists(string(t), string(c), args...)
	var e *goipt.Error
	if errors.As(err, &e) && e.IsNotExist() {
		return false, nil
	}
	return ok, err
}

func (r *runner) DeleteRule(t Table, c Chain, args ...string) error {
	ok, err := r.ipt.ChainExists(string(t), string(c))
	if err != nil || !ok {
		return err
	}
	return r.ipt.DeleteIfExists(string(t), string(c), args...)
}

func (r *runner) DeleteChain(t Table, c Chain) error {
	ok, err := r.ipt.ChainExists(string(t), string(c))
	if err != nil || !ok {
		return err
	}
	return r.ipt.ClearAndDeleteChain(string(t), string(c))
}
