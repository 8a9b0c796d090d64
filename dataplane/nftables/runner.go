package nftables

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/internal/execx"
)

// childRunner runs knftables transactions through nft as a child that dies
// with the agent; knftables' own Run starts nft with no Pdeathsig, and the
// chaos suite found a SIGKILLed agent's nft still running. The transaction
// is written in full to a memfd before nft starts: fed through a pipe, an
// agent killed mid-write would hand nft a truncated file, and a cut on a
// line boundary parses and commits its first half. Listing stays with
// knftables (over netlink).
type childRunner struct {
	knftables.Interface
	path string
}

func newChildRunner(nft knftables.Interface) (*childRunner, error) {
	path, err := exec.LookPath("nft")
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	return &childRunner{Interface: nft, path: path}, nil
}

// Run applies tx in one nft invocation (one kernel transaction).
func (r *childRunner) Run(ctx context.Context, tx *knftables.Transaction) error {
	text, err := txText(tx)
	if err != nil {
		return err
	}
	return r.runScript(ctx, text)
}

// txText is tx's nft input, or the error knftables recorded: a
// transaction knftables refused to build ends with a comment, which nft
// would skip and run the rest.
func txText(tx *knftables.Transaction) (string, error) {
	text := tx.String()
	if i := strings.LastIndex(text, "# ERROR: "); i >= 0 && !strings.Contains(text[i:], "\n") {
		return "", fmt.Errorf("nftables: %s", text[i+len("# ERROR: "):])
	}
	return text, nil
}

// runScript applies nft input text in one nft invocation.
func (r *childRunner) runScript(ctx context.Context, text string) error {
	fd, err := unix.MemfdCreate("steelyard-nft", unix.MFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("nftables: memfd: %w", err)
	}
	f := os.NewFile(uintptr(fd), "nft-input")
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		return fmt.Errorf("nftables: memfd: %w", err)
	}
	cmd := execx.CommandContext(ctx, r.path, "-f", "/proc/self/fd/3")
	cmd.ExtraFiles = []*os.File{f}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := execx.Run(cmd); err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return fmt.Errorf("nft: %w: %s", err, msg)
		}
		return fmt.Errorf("nft: %w", err)
	}
	return nil
}

// script is t as nft input: knftables spells every operation, except that
// consecutive additions of elements without a comment to one set are
// written as one command. knftables writes a command per element, and the
// kernel finds the set of each element message by name in a list of the
// table's sets: with 10,000 weight maps a first sync paid that walk for
// each of its 200,000 elements. Measured with nft 1.0.6 at 10,000
// Services x 10 endpoints (dnat-map layout): 24.8 CPU-s with an element
// per command, 10.8 with one command per set. The shared maps' elements
// keep a command each (their comments).
func (t *ops) script(newTx func() *knftables.Transaction, f fam) (string, error) {
	var b strings.Builder
	tx := newTx()
	flushTx := func() error {
		if tx.NumOperations() == 0 {
			return nil
		}
		text, err := txText(tx)
		if err != nil {
			return err
		}
		b.WriteString(text)
		tx = newTx()
		return nil
	}
	set := "" // the set of the group being built
	var group []string
	flushGroup := func() {
		if len(group) > 0 {
			fmt.Fprintf(&b, "add element %s %s %s { %s }\n", f.nfFamily, TableName, set, strings.Join(group, ", "))
		}
		set, group = "", nil
	}
	for _, o := range t.list {
		obj := o.object(f)
		if el, ok := obj.(*knftables.Element); ok && o.verb == 'a' && el.Comment == nil {
			name := el.Set + el.Map
			if name != set {
				flushGroup()
				if err := flushTx(); err != nil {
					return "", err
				}
				set = name
			}
			item := strings.Join(el.Key, " . ")
			if len(el.Value) > 0 {
				item += " : " + strings.Join(el.Value, " . ")
			}
			group = append(group, item)
			continue
		}
		flushGroup()
		o.replay(tx, obj)
	}
	flushGroup()
	if err := flushTx(); err != nil {
		return "", err
	}
	return b.String(), nil
}
