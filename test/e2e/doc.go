// Package e2e runs the steelyard agent against the real kernel, in network
// namespaces made by test/sandbox, and measures what real connections do:
// weighted shares (both iptables flavours), drained endpoints, UDP, refusal
// of VIPs without endpoints, hairpin, established connections across agent
// restarts and weight changes, re-sync on file changes, explain/verify and
// cleanup.
//
// The suite is one table (modes_test.go): TestKernel runs every case of
// kernelCases in every mode of dpModes (iptables-legacy, iptables-nft,
// nftables) as TestKernel/<case>/<mode>, e.g.
//
//	sudo go test -tags e2e ./test/e2e/ -v -run 'TestKernel/TCPShares/nftables'
//
// A case that needs a feature a mode does not serve yet is skipped in that
// mode only, with "<mode>: not yet: <feature>"; notYet is the one place
// that says which.
//
// The tests carry the build tag e2e and need root; they fail (never skip)
// without it:
//
//	sudo go test -tags e2e ./test/e2e/ -v
//
// TestMain builds cmd/steelyard once (or uses $STEELYARD_BIN). Each test
// makes its own sandbox and manifest directory and removes them, also on
// failure and on Ctrl-C. Nothing is changed outside the namespaces.
//
// Test IP plan (on top of the sandbox's, see test/sandbox):
//
//	198.18.0.10:80   TCP  web   10/90      198.19.1.2 web-1, 198.19.1.3 web-2
//	198.18.0.11:80   TCP  quad  1:2:3:4    198.19.2.2-5 quad-1..quad-4
//	198.18.0.12:80   TCP  zero  1/0/1      198.19.3.2-4 zero-1..zero-3
//	198.18.0.13:53   UDP  dns   10/90      198.19.4.2 dns-1, 198.19.4.3 dns-2
//	198.18.0.14:80   TCP  + :53 UDP  empty (no endpoints: reject)
//	198.18.0.15:80   TCP  self  one pod    198.19.5.2 self-1 (hairpin)
//	198.19.254.2     the client
package e2e
