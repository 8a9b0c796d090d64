package dataplane

import (
	"strings"
	"testing"
)

// The Service port name of conformance UDPRouteParentRefPortAndSectionName's
// third listener: 136 bytes, over nft's 128.
const longRouteName = "gateway-conformance-infra/udp-multi-listener-gateway:by-section-and-port/UDPRoute/gateway-conformance-infra/udp-echo-by-section-and-port"

func TestShortName(t *testing.T) {
	if len(longRouteName) != 136 {
		t.Fatalf("fixture is %d bytes", len(longRouteName))
	}
	if got := ShortName("default/web:http", NftCommentMax); got != "default/web:http" {
		t.Errorf("short name changed: %q", got)
	}
	exact := strings.Repeat("a", NftCommentMax)
	if got := ShortName(exact, NftCommentMax); got != exact {
		t.Errorf("a name of exactly the limit changed: %q", got)
	}
	got := ShortName(longRouteName, NftCommentMax)
	if len(got) != NftCommentMax {
		t.Errorf("ShortName is %d bytes, want %d: %q", len(got), NftCommentMax, got)
	}
	// Readable start, "~" and 16 hex digits.
	if !strings.HasPrefix(got, longRouteName[:NftCommentMax-17]) || got[NftCommentMax-17] != '~' {
		t.Errorf("ShortName %q does not keep the name's start", got)
	}
	if again := ShortName(longRouteName, NftCommentMax); again != got {
		t.Errorf("not deterministic: %q then %q", got, again)
	}
	// Two names that differ only after the cut stay apart.
	other := strings.TrimSuffix(longRouteName, "port") + "name"
	if ShortName(other, NftCommentMax) == got {
		t.Errorf("%q and %q share a short name", other, longRouteName)
	}
}

func TestSameName(t *testing.T) {
	short := ShortName(longRouteName, NftCommentMax-len(" external IP"))
	other := strings.TrimSuffix(longRouteName, "port") + "name"
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"default/web:http", "default/web:http", true},
		{"default/web:http", "default/web:https", false},
		{longRouteName, short, true},
		{short, longRouteName, true},
		{other, short, false},
		{longRouteName, ShortName(longRouteName, XtCommentMax-96), true}, // fits: unchanged
		{longRouteName[:NftCommentMax], longRouteName, false},            // truncated, not shortened
	} {
		if got := SameName(c.a, c.b); got != c.want {
			t.Errorf("SameName(%q, %q) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}
