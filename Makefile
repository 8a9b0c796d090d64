# steelyard: make build | demo | test | bench
#
# demo, test and bench need root (network namespaces, iptables). As root
# they run directly; as another user they elevate with sudo. They install
# what they need (scripts/install-deps.sh).

SHELL := /bin/bash
GO ?= go
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)

ifeq ($(shell id -u),0)
ROOT :=
else
# Keep the caller's Go toolchain and caches under sudo.
ROOT := sudo env PATH="$(PATH)" HOME="$(HOME)" GOPATH="$(shell $(GO) env GOPATH)" GOCACHE="$(shell $(GO) env GOCACHE)" GOMODCACHE="$(shell $(GO) env GOMODCACHE)"
endif

.PHONY: all build deps demo test unit e2e k8s cni control-plane bench bench-k8s fuzz vet clean
.PHONY: ingress bench-ingress
.PHONY: ipvs

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/steelyard ./cmd/steelyard
	$(GO) build -ldflags "-X main.buildVersion=$(VERSION)" -o bin/steelyard-cni ./cmd/steelyard-cni

deps:
	$(ROOT) scripts/install-deps.sh

# The demo: a sandbox of network namespaces, steelyard on examples/, real
# connections through each VIP, observed split beside the configured one.
demo: deps build
	$(GO) build -o bin/steelyard-demo ./test/demo
	$(ROOT) bin/steelyard-demo --steelyard bin/steelyard --examples examples

# Every suite: vet, unit tests (no root), kernel tests (root, in namespaces),
# and the tests against a real kube-apiserver and etcd (built from source
# once, about 11 minutes, then cached under ~/.cache/steelyard).
test: deps build vet unit e2e k8s cni ingress ipvs

vet:
	$(GO) vet ./...
	$(GO) vet -tags e2e ./test/...
	$(GO) vet -tags k8s ./test/...
	$(GO) vet -tags ipvsvm ./test/...
	$(GO) vet -tags cni ./test/...
	$(GO) vet -tags ingress ./test/...

# kube-apiserver, kubectl, kube-proxy (v1.37.2) and etcd (v3.7.3), built
# through the Go module proxy and cached by version.
control-plane:
	scripts/control-plane/build.sh

unit:
	$(GO) test -count=1 ./...

e2e:
	$(ROOT) env STEELYARD_BIN=$(CURDIR)/bin/steelyard $(GO) test -tags e2e -count=1 -timeout 30m -v ./test/sandbox/ ./test/e2e/

k8s: control-plane
	$(ROOT) env STEELYARD_BIN=$(CURDIR)/bin/steelyard $(GO) test -tags k8s -count=1 -timeout 30m -v ./test/controlplane/ ./test/k8s/

# The IPVS dataplane on a real kernel: Debian's cloud kernel (IPVS as
# modules) booted under qemu with a small initramfs (scripts/vm/), the suite
# of test/ipvs inside it with real traffic. Installs qemu, the kernel,
# busybox-static, ipvsadm and ipset itself; the initramfs is cached under
# ~/.cache/steelyard/vm-<kernel>. About 10 s of boot, under 2 minutes.
ipvs:
	$(ROOT) env GO=$(GO) scripts/vm/test-ipvs.sh

# The chained CNI plugin (real bridge + host-local + steelyard-cni through
# libcni, every spec version) and stale UDP flow cleanup, in namespaces. The
# reference plugins are built once through the Go module proxy and cached
# under ~/.cache/steelyard/cni-plugins-<version>.
cni: deps build
	plugins=$$(scripts/cni-plugins.sh) && $(ROOT) env STEELYARD_BIN=$(CURDIR)/bin/steelyard STEELYARD_CNI_BIN=$(CURDIR)/bin/steelyard-cni CNI_PLUGINS_DIR=$$plugins $(GO) test -tags cni -count=1 -timeout 20m -v ./test/cni/

# The L7 layer: the agent with --ingress and Debian's nginx as its child,
# against a real API server, traffic from a client namespace to pod
# namespaces (routing, TLS, injection, weights, churn without reloads).
ingress: deps build control-plane
	$(ROOT) env STEELYARD_BIN=$(CURDIR)/bin/steelyard $(GO) test -tags ingress -count=1 -timeout 20m -v ./test/ingress/

# Benchmarks print tables; they assert nothing.
bench: deps build
	$(GO) test -run '^$$' -bench . -benchmem ./dataplane/...
	$(ROOT) scripts/bench-iptables.sh
	$(ROOT) env SIZES="$(SIZES)" scripts/bench-scale.sh

# steelyard beside kube-proxy v1.37.2 (iptables and nftables modes) against
# a real API server with 1,000 and 10,000 Services x 10 endpoints.
bench-k8s: deps build control-plane
	$(ROOT) env SERVICES="$(SERVICES)" IPTABLES_MODE="$(IPTABLES_MODE)" NFT_MAX_SERVICES="$(NFT_MAX_SERVICES)" PROXIES="$(PROXIES)" CHANGES="$(CHANGES)" BENCH_ARGS="$(BENCH_ARGS)" scripts/bench-k8s.sh

# Constant-rate HTTP load through nginx, steady then with endpoint churn,
# for VIP upstreams (steelyard) and pod upstreams (reload per change).
bench-ingress: deps build control-plane
	$(ROOT) env RATE="$(RATE)" DURATION="$(DURATION)" PERIOD="$(PERIOD)" MODES="$(MODES)" scripts/bench-ingress.sh

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParseWeights -fuzztime 30s ./controller/
	$(GO) test -run '^$$' -fuzz FuzzParseSplit -fuzztime 30s ./controller/

clean:
	rm -rf bin
