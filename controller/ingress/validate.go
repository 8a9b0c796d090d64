package ingress

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
)

// Everything that reaches nginx.conf from the API passes one of these
// checks, and the template quotes it as well. The character sets are
// deliberately narrow: no whitespace, quotes, ';', '{', '}', '$', '#', '\'
// or control characters can get through, so no value can end a directive,
// open a block or expand a variable.
var (
	// A DNS-1123 subdomain (lower case), optionally "*." + subdomain: what
	// the Ingress API accepts for a host.
	hostRE = regexp.MustCompile(`^(\*\.)?[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$`)
	// An absolute path of URL path characters, without '%' (nginx matches
	// locations against the decoded URI, so an escaped path would never
	// match), and none of the characters listed above.
	pathRE = regexp.MustCompile(`^/[A-Za-z0-9/._~!*+,:@=&()-]*$`)
	// Object names as the API server allows them (DNS-1123 labels and
	// subdomains); used in upstream names and comments.
	nameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$`)
	// A port name (IANA_SVC_NAME).
	portNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?$`)
)

// validHost checks an Ingress rule or TLS host.
func validHost(h string) error {
	if len(h) > 253 || !hostRE.MatchString(h) {
		return fmt.Errorf("host %q: want a lower-case DNS name, optionally starting with \"*.\"", h)
	}
	return nil
}

// validPath checks an Ingress path: absolute, URL path characters only, no
// empty, "." or ".." elements (nginx normalises the request URI, so such a
// location could never match).
func validPath(p string) error {
	if len(p) > 1024 || !pathRE.MatchString(p) {
		return fmt.Errorf("path %q: want an absolute path of letters, digits and -._~!*+,:@=&()/ (no spaces, quotes, ;, {, }, $, %%, # or \\)", p)
	}
	elems := strings.Split(strings.TrimSuffix(p[1:], "/"), "/")
	if p == "/" {
		return nil
	}
	for _, e := range elems {
		if e == "" || e == "." || e == ".." {
			return fmt.Errorf("path %q: empty, \".\" or \"..\" element", p)
		}
	}
	return nil
}

// validName checks a namespace, Service or Secret name.
func validName(kind, n string) error {
	if !nameRE.MatchString(n) {
		return fmt.Errorf("%s name %q: want a DNS-1123 name", kind, n)
	}
	return nil
}

// validIP checks an address that becomes an upstream server.
func validIP(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" || a.IsUnspecified() {
		return netip.Addr{}, fmt.Errorf("address %q: want an IPv4 or IPv6 address", s)
	}
	return a, nil
}
