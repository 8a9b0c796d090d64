package dataplane

import (
	"crypto/sha256"
	"encoding/hex"
)

// Kernel comment limits, in bytes. Kubernetes names have none that fits
// them: a Gateway route's Service port name is namespace/gateway:listener/
// kind/namespace/route, up to about 900 bytes, and conformance
// UDPRouteParentRefPortAndSectionName's is 136.
const (
	// NftCommentMax is nft's limit on rule and element comments
	// (NFTNL_UDATA_COMMENT_MAXLEN); nft refuses the whole transaction
	// for one comment longer than that.
	NftCommentMax = 128
	// XtCommentMax is the iptables comment match's limit
	// (XT_MAX_COMMENT_LEN, 256 with the terminating NUL).
	XtCommentMax = 255
	// IpsetCommentMax is ipset's limit on member comments
	// (IPSET_MAX_COMMENT_SIZE).
	IpsetCommentMax = 255
)

// shortHashLen is the hex digits of the name's SHA-256 a ShortName ends
// with: 64 bits, so two long names sharing their prefix do not collide.
const shortHashLen = 16

// ShortName returns name when it is at most max bytes long; otherwise its
// first bytes, "~" and 16 hex digits of its SHA-256, exactly max bytes in
// all (max must exceed 17). The same name always gives the same short form,
// so a comment stays stable across syncs, its start stays readable, and
// SameName matches it with the full name.
func ShortName(name string, max int) string {
	if len(name) <= max {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	tail := "~" + hex.EncodeToString(sum[:])[:shortHashLen]
	return name[:max-len(tail)] + tail
}

// SameName reports whether two Service port names agree: equal, or one
// the ShortName of the other (explain reads names from kernel comments,
// verify compares them with the desired state's full names).
func SameName(a, b string) bool {
	if a == b {
		return true
	}
	if len(a) > len(b) {
		a, b = b, a
	}
	return len(a) > shortHashLen+1 && ShortName(b, len(a)) == a
}
