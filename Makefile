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
.PHONY: gateway
.PHONY: docs docs-check
.PHONY: node node-deps cluster-up cluster-down bench-node multinode
.PHONY: conformance gateway-conformance

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
test: deps build bpf-check prebuild vet unit chart-check e2e k8s cni ingress ipvs ebpf-vm-smoke gateway node multinode docs-check

# The slow cache builds of later suites start in the background
# (scripts/prebuild.sh, in the order the suites need them: Kubernetes from
# source, the CNI plugins, a warm-up of the Go build cache for the VM
# suites' static test binaries, containerd, the node's rootfs and images),
# so that with every cache cold they overlap vet, unit and e2e, which leave
# a core idle much of the time. At nice 19: the foreground suites are the
# critical path and keep the cores they use; the builds take what is left,
# and the whole machine while a suite waits for one of them. Each cache
# script holds its cache's lock (scripts/lib/lock.sh): the suite that needs
# one waits for it there, and builds it itself if the background build
# failed. Their output: bin/prebuild.log.
.PHONY: prebuild
prebuild:
	@mkdir -p bin
	@nice -n 19 scripts/prebuild.sh >bin/prebuild.log 2>&1 </dev/null &

# The ebpf mode's socket programs (dataplane/ebpf/bpf/*.c), compiled with
# Debian's clang through bpf2go (the tool of go.mod). The generated
# socklb_bpfel.go and .o are committed, so go build needs no clang:
# bpf-generate rewrites them, bpf-check (in test) regenerates them and
# fails when they differ from the committed ones.
.PHONY: bpf-generate bpf-check
BPF_CFLAGS := -O2 -g -Wall -Werror -I/usr/include/$(shell uname -m)-linux-gnu
bpf-generate:
	BPF2GO_CFLAGS="$(BPF_CFLAGS)" $(GO) generate ./dataplane/ebpf/

bpf-check: deps bpf-generate
	@if [ -n "$$(git status --porcelain -- 'dataplane/ebpf/*_bpfel.*')" ]; then \
		git status --short -- 'dataplane/ebpf/*_bpfel.*'; \
		echo "bpf-check: the generated eBPF files differ from the committed ones (run make bpf-generate and commit)"; exit 1; fi

vet:
	$(GO) vet ./...
	$(GO) vet -tags e2e ./test/... ./dataplane/...
	$(GO) vet -tags k8s ./test/...
	$(GO) vet -tags ipvsvm ./test/...
	$(GO) vet -tags cni ./test/...
	$(GO) vet -tags ingress ./test/...
	$(GO) vet -tags gateway ./test/...
	$(GO) vet -tags node ./test/...
	$(GO) vet -tags node,multinode ./test/...

# The Helm chart (charts/steelyard) through the Helm v4 library, in a Go
# module of its own (test/chart) so Helm's dependencies stay out of the
# agent's. manifests/ is the chart rendered with its default values:
# `make manifests` writes it; chart-check (in test) vets and tests the tool,
# lints the chart and fails when manifests/ differs from a fresh render.
# `make chart` packages it, version and appVersion stamped from VERSION.
.PHONY: chart chart-check chart-tool manifests
chart-tool:
	cd test/chart && $(GO) build -o $(CURDIR)/bin/steelyard-chart .

manifests: chart-tool
	bin/steelyard-chart render -chart charts/steelyard -out manifests

chart-check: chart-tool
	bin/steelyard-chart check -chart charts/steelyard -manifests manifests
	cd test/chart && $(GO) vet ./... && $(GO) test -count=1 ./...

chart: chart-tool
	bin/steelyard-chart package -chart charts/steelyard -version $(VERSION) -out bin

# The example Prometheus rules of docs/operations.md evaluated by
# Prometheus' PromQL engine (v0.316.0, a Go module of its own: test/alerts)
# on synthetic series: SteelyardSplitDiverges silent within noise, firing
# on a split that diverges. Not in `make test`: its cold build (modules
# downloaded, 2 cores shared) took 58 s to download and 2 min 27 s to
# build and run (2026-12-06), over the 2 minutes a `make test` step may add.
.PHONY: alerts-check
alerts-check:
	cd test/alerts && $(GO) vet ./... && $(GO) test -count=1 ./...

# kube-apiserver, kubectl, kube-proxy (v1.37.2) and etcd (v3.7.3), built
# through the Go module proxy and cached by version.
control-plane:
	scripts/control-plane/build.sh

unit:
	$(GO) test -count=1 ./...

e2e:
	$(ROOT) env STEELYARD_BIN=$(CURDIR)/bin/steelyard $(GO) test -tags e2e -count=1 -timeout 30m -v ./test/sandbox/ ./test/e2e/ ./dataplane/nftables/ ./dataplane/iptables/ ./dataplane/nfacct/ ./dataplane/ebpf/ ./test/bench/k8s/

k8s: control-plane
	$(ROOT) env STEELYARD_BIN=$(CURDIR)/bin/steelyard $(GO) test -tags k8s -count=1 -timeout 30m -v ./test/controlplane/ ./test/k8s/
	$(ROOT) env STEELYARD_BIN=$(CURDIR)/bin/steelyard STEELYARD_MODE=nftables $(GO) test -tags k8s -count=1 -timeout 30m -v ./test/k8s/

# The IPVS dataplane on a real kernel: Debian's cloud kernel (IPVS as
# modules) booted under qemu with a small initramfs (scripts/vm/), the suite
# of test/ipvs inside it with real traffic. Installs qemu, the kernel,
# busybox-static, ipvsadm and ipset itself; the initramfs is cached under
# ~/.cache/steelyard/vm-<kernel>. About 10 s of boot per VM; the chaos test
# (docs/chaos.md) has a VM of its own: 88-286 s measured on the shared host
# (load 10-33; the VM under TCG slows with it); bounded at 7 minutes.
# TestSCTP (real SCTP associations in every mode; the VM loads sctp) has
# a VM of its own too: 3.5 minutes at host load 14-24, 6 at load 34;
# bounded at 10. TestIPVSObserved (20,000 connections counted by IPVS,
# issue 23) too, bounded at 10. The main suite's VM: TestIPVS alone took
# 233 s at host load 22 (2026-12-06, the VM under TCG slows with the
# host), so 300 s ran out in the next test; bounded at 10 minutes.
ipvs:
	$(ROOT) env GO=$(GO) IPVS_VM_TIMEOUT=600 scripts/vm/test-ipvs.sh -test.skip 'TestIPVSCapabilities|TestIPVSChaos|TestSCTP|TestIPVSObserved'
	$(ROOT) env GO=$(GO) IPVS_VM_TIMEOUT=600 scripts/vm/test-ipvs.sh -test.run TestIPVSObserved
	$(ROOT) env GO=$(GO) IPVS_VM_TIMEOUT=300 scripts/vm/test-ipvs.sh -test.run TestIPVSCapabilities
	$(ROOT) env GO=$(GO) IPVS_VM_TIMEOUT=600 scripts/vm/test-ipvs.sh -test.run TestSCTP
	$(ROOT) env GO=$(GO) IPVS_VM_TIMEOUT=420 scripts/vm/test-ipvs.sh -test.run TestIPVSChaos

# The ebpf rows of the kernel table (test/e2e, TestKernel/<case>/ebpf) on a
# second kernel: Debian's 6.1 in the same VM (scripts/vm/test-ebpf.sh; the
# host runs 6.18). TCPShares and ObservedShares are left out: their 20,000
# and 40,000 connections alone would take about 20 minutes under TCG (about
# 60 connections a second in the guest at host load 15); the shares are
# still checked there by WeightZeroGetsNothing, UDPShares and OtherOrigins
# (3,000-4,000 each). ResyncOnFileChange and ExplainVerifyAndRepair are
# left out too: they time the agent against the host's speed (a re-sync
# within 1.5 s: 1.58 s in the guest; verify run between two 1 s full syncs:
# under TCG verify takes longer than that and always finds the table
# repaired, 2026-12-07), not the kernel. NodePort, ExternalIPsAndLoad-
# BalancerSourceRanges and IPv6 run (19 rows): their read timeouts in the
# guest come with the host's load in both modes (0 of 24,500 connections
# per mode at load 2.4-3.9; 76 nftables, 134 ebpf of 17,500 at load 4.5-6,
# docs/testing.md#make-ipvs), so run this target on a quiet machine.
# About 20 minutes at host load 3-4 (the 16 rows' times in three partial
# runs plus these three rows' 3-6 minutes).
# EBPF_VM_RUN / EBPF_VM_SKIP pick other rows.
#
# make test runs ebpf-vm-smoke: seven of those rows (shares over TCP and
# UDP, weight 0, ClientIP affinity, hairpin, rejects, terminating
# fallback, cleanup), about a third of the time, to keep the cold CI under
# an hour; `make ebpf-vm` runs all 19.
EBPF_VM_RUN ?= ^TestKernel$$/./^ebpf$$
EBPF_VM_SKIP ?= ^TestKernel$$/^(TCPShares|ObservedShares|ResyncOnFileChange|ExplainVerifyAndRepair)$$
EBPF_VM_SMOKE = ^TestKernel$$/^(WeightZeroGetsNothing|UDPShares|SessionAffinity|Hairpin|RejectWithoutEndpoints|TerminatingFallbackPerCategory|CleanupRemovesOnlySteelyard)$$/^ebpf$$
.PHONY: ebpf-vm ebpf-vm-smoke
ebpf-vm:
	$(ROOT) env GO=$(GO) EBPF_VM_TIMEOUT=2700 scripts/vm/test-ebpf.sh -test.run '$(EBPF_VM_RUN)' -test.skip '$(EBPF_VM_SKIP)'
ebpf-vm-smoke:
	$(ROOT) env GO=$(GO) EBPF_VM_TIMEOUT=1200 scripts/vm/test-ebpf.sh -test.run '$(EBPF_VM_SMOKE)'

# The IPVS chaos test alone (SIGKILLs, SIGTERM, ipvsadm -C) in its own VM
# boot, with 7 minutes for it (docs/chaos.md); `make ipvs` runs it too.
# CHAOS_KILLS=100 lands 100 SIGKILLs instead of 8 (15 minutes for the VM).
.PHONY: ipvs-chaos
ipvs-chaos:
	$(ROOT) env GO=$(GO) IPVS_VM_TIMEOUT=$(if $(CHAOS_KILLS),900,420) scripts/vm/test-ipvs.sh -test.run TestIPVSChaos $(if $(CHAOS_KILLS),-chaos-kills $(CHAOS_KILLS))

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

# The Gateway API layer against a real API server: the CRDs of the
# sigs.k8s.io/gateway-api module in go.mod (its standard install manifest),
# TCPRoute/UDPRoute shares by real traffic, status conditions,
# ReferenceGrant, Service-parent routes.
gateway: deps build control-plane
	$(ROOT) env STEELYARD_BIN=$(CURDIR)/bin/steelyard $(GO) test -tags gateway -count=1 -timeout 20m -v ./test/gateway/

# Benchmarks print tables; they assert nothing.
bench: deps build
	$(GO) test -run '^$$' -bench . -benchmem ./dataplane/...
	$(ROOT) scripts/bench-iptables.sh
	$(ROOT) env SIZES="$(SIZES)" scripts/bench-scale.sh

# steelyard beside kube-proxy v1.37.2 (iptables and nftables modes) against
# a real API server with 1,000 and 10,000 Services x 10 endpoints.
bench-k8s: deps build control-plane
	$(ROOT) env SERVICES="$(SERVICES)" IPTABLES_MODE="$(IPTABLES_MODE)" NFT_MAX_SERVICES="$(NFT_MAX_SERVICES)" PROXIES="$(PROXIES)" CHANGES="$(CHANGES)" CHANGE_GAP="$(CHANGE_GAP)" IDLE="$(IDLE)" BENCH_ARGS="$(BENCH_ARGS)" scripts/bench-k8s.sh

# Constant-rate HTTP load through nginx, steady then with endpoint churn,
# for VIP upstreams (steelyard) and pod upstreams (reload per change).
bench-ingress: deps build control-plane
	$(ROOT) env RATE="$(RATE)" DURATION="$(DURATION)" PERIOD="$(PERIOD)" MODES="$(MODES)" scripts/bench-ingress.sh

# A real node: kubelet, containerd v2.3 (built from the Go module proxy,
# with Debian's runc), kube-controller-manager and kube-scheduler v1.37.2,
# in network namespaces, cgroups and a mount namespace of its own;
# steelyard installed from manifests/ with kubectl; real pods (agnhost);
# then the chart with the Helm library and helm upgrade iptables -> nftables.
# Images are built here without a registry (scripts/node/images.sh) and
# everything is cached under ~/.cache/steelyard.
NODE_ENV = STEELYARD_CONTAINERD_DIR=$$(scripts/node/containerd.sh) CNI_PLUGINS_DIR=$$(scripts/cni-plugins.sh) STEELYARD_IMAGES_DIR=$$(scripts/node/images.sh)

node-deps: deps control-plane
	$(ROOT) scripts/install-deps.sh --node

node: node-deps chart-tool
	$(ROOT) env $(NODE_ENV) STEELYARD_CHART_BIN=$(CURDIR)/bin/steelyard-chart STEELYARD_VERSION=$(VERSION) $(GO) test -tags node -count=1 -timeout 30m -v ./test/node/

# The multi-node tests (test/node/multinode*_test.go): the same harness with
# three dual-stack nodes on a node LAN (node IPAM, routed pod ranges of both
# families, zones a/b/c; a 10/90 RequireDualStack Service in both families),
# steelyard from manifests/ on each (no pod range given); a 10/90 Service
# across nodes, external/internalTrafficPolicy Local, trafficDistribution,
# kubectl drain and a DaemonSet rolling update under load, and the move from
# kube-proxy's DaemonSet to steelyard node by node and back
# (MIGRATE_MODES=iptables,nftables for both of kube-proxy's modes;
# default iptables). In test since it is short (4 min 17 s warm at load
# 20-30 before the migration test, docs/testing.md#make-multinode).
multinode: node-deps
	$(ROOT) env $(NODE_ENV) STEELYARD_MIGRATE_MODES="$(MIGRATE_MODES)" $(GO) test -tags node,multinode -count=1 -timeout 30m -v -run '^TestMultiNode' ./test/node/

# The seed's dynamic test on the real node: steelyard with --ingress, HTTP
# load through nginx to a Deployment scaled 5 <-> 7, VIP vs pod upstreams;
# docs/bench-node.{json,svg} and a table (docs/benchmarks.md). Not in test.
bench-node: node-deps
	$(ROOT) env $(NODE_ENV) RATE="$(RATE)" PROBE="$(PROBE)" DURATION="$(DURATION)" MODES="$(MODES)" PHASES="$(PHASES)" OUT="$(OUT)" scripts/bench-node.sh

# The same node for a person: prints the admin kubeconfig's path; the node
# runs in the background until `make cluster-down`. Then:
#   export KUBECONFIG=<path>; kubectl apply -f manifests/ (see README).
# NODES=3 starts three nodes on a node LAN of their own (node IPAM, routed
# pod ranges, zones zone-a/b/c; test/node/cluster/lan.go); DUALSTACK=1 with
# NODES>=2 adds IPv6 (test/node/cluster/dualstack.go, docs/cluster.md).
cluster-up: node-deps
	$(GO) build -o bin/steelyard-cluster ./test/node/clusterctl
	@$(ROOT) rm -f /tmp/steelyard-cluster/kubeconfig
	@$(ROOT) env $(NODE_ENV) bash -c 'nohup bin/steelyard-cluster up --nodes $(or $(NODES),1) $(if $(DUALSTACK),--dual-stack) >/tmp/steelyard-cluster.log 2>&1 & \
	  for i in $$(seq 600); do \
	    if [ -s /tmp/steelyard-cluster/kubeconfig ]; then echo "KUBECONFIG=$$(cat /tmp/steelyard-cluster/kubeconfig)"; exit 0; fi; \
	    if ! kill -0 $$! 2>/dev/null; then tail -n 30 /tmp/steelyard-cluster.log; exit 1; fi; sleep 1; \
	  done; echo "cluster-up: not Ready after 600 s (log: /tmp/steelyard-cluster.log)"; exit 1'

cluster-down:
	$(GO) build -o bin/steelyard-cluster ./test/node/clusterctl
	$(ROOT) bin/steelyard-cluster down

# Kubernetes' own e2e Service tests (e2e.test and ginkgo v1.37.2, built from
# source and cached) on a cluster of NODES nodes (default 3: the multi-node
# and zone specs need them), once per proxy: steelyard iptables, steelyard
# nftables, kube-proxy iptables and nftables (the references); one table,
# and each proxy's summary in docs/conformance/<proxy>.json (commit them,
# then `make docs`). Fails when a selected spec fails for a steelyard proxy.
# Not part of test (tens of minutes). PROXIES=kube-proxy,... picks some;
# PROXIES=steelyard-ebpf (not in the default list yet) runs the chart's mode
# ebpf on every node (rendered by bin/steelyard-chart template),
# FOCUS=regexp narrows the run, GINKGO_NODES sets ginkgo's parallelism
# (default 4), TIMEOUT ginkgo's timeout per proxy (default 90m), PARALLEL=1
# runs the proxies at once, a cluster each
# (docs/conformance.md; focus and skip rules in test/conformance/skip.txt).
conformance: node-deps chart-tool
	$(GO) build -o bin/steelyard-conformance ./test/conformance
	e2e=$$(scripts/conformance/build.sh) && images=$$($(ROOT) scripts/conformance/images.sh) && \
	$(ROOT) env $(NODE_ENV) bin/steelyard-conformance --e2e-dir "$$e2e" --images-dir "$$images" --chart-bin bin/steelyard-chart \
	  --proxies "$(PROXIES)" --focus "$(FOCUS)" --nodes "$(or $(NODES),3)" --ginkgo-nodes "$(or $(GINKGO_NODES),4)" \
	  $(if $(TIMEOUT),--timeout "$(TIMEOUT)") $(if $(PARALLEL),--parallel)

# The upstream Gateway API conformance suite (the sigs.k8s.io/gateway-api
# release of test/gatewayconformance/go.mod) on the real node, profiles
# GATEWAY-TCP, GATEWAY-UDP and GATEWAY-HTTP: echo-basic built from that
# module and imported, steelyard from manifests/ with --gateway --ingress,
# the core and every implemented extended feature; MODE=iptables (default)
# or nftables writes docs/gateway-conformance-report-MODE.yaml (commit it).
# Not part of `make test`.
gateway-conformance: node-deps
	$(ROOT) env $(NODE_ENV) GO=$(GO) scripts/gateway-conformance/run.sh

# Every fuzz target for FUZZTIME each (plain go test runs their seed
# corpora: the f.Add seeds and testdata/fuzz/, where crashers are kept).
FUZZTIME ?= 20s
FUZZ_TARGETS := ./controller/:FuzzParseWeights ./controller/:FuzzParseSplit ./controller/:FuzzParseSliceWeight \
	./controller/:FuzzManifests ./controller/:FuzzBuild ./controller/:FuzzBuildObjects ./cni/:FuzzPlugin \
	./controller/ingress/:FuzzRender ./controller/ingress/:FuzzSettings ./controller/ingress/:FuzzHTTPRouteValues \
	./controller/gateway/:FuzzTranslate ./cmd/steelyard/:FuzzMasqueradeFlags ./dataplane/ebpf/:FuzzMapEncoders
fuzz:
	set -e; for t in $(FUZZ_TARGETS); do \
		$(GO) test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) "$${t%%:*}"; \
	done

# The tables of figures in README.md and docs/*.md, regenerated in place
# from the committed data (docs/bench-*.json*, docs/gateway-conformance-report*.yaml,
# docs/conformance/*.json) by test/docsgen. Run it after a benchmark.
docs:
	$(GO) run ./test/docsgen

# The runnable commands of README.md and docs/*.md (marked <!-- docs-check -->),
# in a throwaway network namespace beside `steelyard run --manifests examples`;
# first `docsgen -check`: a generated table that differs from its data, or a
# figure in a README.md table outside a generated region, fails.
docs-check: deps build
	$(GO) build -o bin/steelyard-docsgen ./test/docsgen
	$(ROOT) env STEELYARD_BIN=$(CURDIR)/bin/steelyard DOCSGEN_BIN=$(CURDIR)/bin/steelyard-docsgen scripts/docs-check.sh

clean:
	rm -rf bin
