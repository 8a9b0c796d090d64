#!/usr/bin/env bash
# `make gateway-conformance`: the upstream Gateway API conformance suite
# (sigs.k8s.io/gateway-api/conformance, the release test/gatewayconformance
# requires) against steelyard on the real node of test/node/cluster.
#
#  1. echo-basic built from that module and imported into the node's
#     containerd under the names the suite's manifests use (images.sh);
#  2. the node up (steelyard-cluster, a state dir of this process's own);
#  3. the CRDs of the module's standard install manifest, then manifests/
#     (steelyard), manifests/gateway and manifests/ingress, the agent given
#     --gateway --gateway-address-pool --ingress;
#  4. the suite's test binary run inside the node's network namespace, where
#     Gateway addresses (from the pool, 198.18.x) are captured like VIPs and
#     the API server is relayed: nothing changes in the root namespace;
#  5. the report written to $REPORT (default
#     docs/gateway-conformance-report-$MODE.yaml), with the suite's --mode
#     set to the dataplane and the machine's load average at the start and
#     end appended (steelyardLoadAverage).
#
# PROFILES, FEATURES, SKIP, MODE (iptables, nftables) and POOL override the
# defaults below.
#
# Needs root and the environment of `make node` (STEELYARD_CONTAINERD_DIR,
# CNI_PLUGINS_DIR, STEELYARD_IMAGES_DIR). The node is torn down at exit.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
mod=$repo/test/gatewayconformance
go=${GO:-go}
# The dataplane (steelyard-config MODE): iptables or nftables.
mode=${MODE:-iptables}
report=${REPORT:-$repo/docs/gateway-conformance-report-$mode.yaml}
pool=${POOL:-198.18.200.0/24}
profiles=${PROFILES:-GATEWAY-TCP,GATEWAY-UDP,GATEWAY-HTTP}
# The core features of the three profiles, then every extended feature the
# nginx layer implements (feature names of gateway-api v1.6.3; what is not
# claimed, and why, is in docs/gateway.md#conformance).
core=Gateway,ReferenceGrant,TCPRoute,UDPRoute,HTTPRoute
extended=GatewayPort8080,HTTPRouteQueryParamMatching,HTTPRouteMethodMatching,HTTPRouteResponseHeaderModification
extended+=,HTTPRoutePortRedirect,HTTPRouteSchemeRedirect,HTTPRoutePathRedirect,HTTPRoute303RedirectStatusCode
extended+=,HTTPRoute307RedirectStatusCode,HTTPRoute308RedirectStatusCode,HTTPRouteHostRewrite,HTTPRoutePathRewrite
extended+=,HTTPRouteParentRefPort,HTTPRouteNamedRouteRule
features=${FEATURES:-$core,$extended}
# Tests to skip (comma-separated), each with its reason in docs/gateway.md.
skip=${SKIP:-}
log() { echo "gateway-conformance: $*" >&2; }
case $mode in iptables | nftables) ;; *) log "MODE $mode: want iptables or nftables (IPVS: see docs/gateway.md#conformance)"; exit 2 ;; esac
state=$(mktemp -d /tmp/steelyard-gwconf-$$-XXXX)

cleanup() {
	if [[ -n ${up_pid:-} ]] && kill -0 "$up_pid" 2>/dev/null; then
		log "tearing the node down"
		kill -TERM "$up_pid" || true
		wait "$up_pid" || true
	fi
	rm -rf "$state"
}
trap cleanup EXIT

mapfile -t images < <("$here/images.sh")
(cd "$mod" && "$go" test -c -o "$state/conformance.test" .)
"$go" build -C "$repo" -o "$state/steelyard-cluster" ./test/node/clusterctl

log "starting the node (state $state)"
"$state/steelyard-cluster" up --state "$state" >"$state/up.log" 2>&1 &
up_pid=$!
for _ in $(seq 300); do
	[[ -s $state/kubeconfig ]] && break
	if ! kill -0 "$up_pid" 2>/dev/null; then tail -n 40 "$state/up.log" >&2; exit 1; fi
	sleep 1
done
[[ -s $state/kubeconfig ]] || { log "node not Ready after 300 s"; tail -n 40 "$state/up.log" >&2; exit 1; }
export KUBECONFIG=$(cat "$state/kubeconfig")
# steelyard-cluster logs "node NAME: InternalIP ..., netns NS, zone ...".
netns=$(sed -n 's/.*node [^ ]*: InternalIP .*, netns \([^,]*\), zone.*/\1/p' "$state/up.log" | head -n 1)
dir=$(sed -n 's/.*Ready in [^ ]* (dir \([^,]*\),.*/\1/p' "$state/up.log" | tail -n 1)
[[ -n $netns && -n $dir ]] || { log "cannot read the node's netns and dir from $state/up.log"; exit 1; }
kubectl() { "${KUBECTL:-$HOME/.cache/steelyard/k8s-v1.37.2/kubectl}" "$@"; }
for img in "${images[@]}"; do
	"$STEELYARD_CONTAINERD_DIR/ctr" --address "$dir/containerd/containerd.sock" -n k8s.io images import --local "$img" >/dev/null
done
log "node up: netns $netns, ${#images[@]} images imported (echo-basic, coredns)"

crds=$(cd "$mod" && "$go" list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api)/config/crd/standard
kubectl apply --server-side -f "$crds" >/dev/null
kubectl wait --for=condition=Established --timeout=60s crd --all >/dev/null
apiport=$(sed -n 's#.*server: https://127.0.0.1:\([0-9]*\).*#\1#p' "$KUBECONFIG" | head -n 1)
kubectl apply -f "$repo/manifests" -f "$repo/manifests/gateway" -f "$repo/manifests/ingress" >/dev/null
kubectl -n steelyard create configmap steelyard-apiserver \
	--from-literal=KUBERNETES_SERVICE_HOST=198.19.0.1 --from-literal=KUBERNETES_SERVICE_PORT="$apiport" >/dev/null
kubectl -n steelyard patch configmap steelyard-config --type=merge -p '{"data":{"CLUSTER_CIDR":"198.19.64.0/18","MODE":"'"$mode"'"}}' >/dev/null
kubectl -n steelyard patch ds steelyard --type=json -p '[
 {"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--gateway"},
 {"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--gateway-address-pool='"$pool"'"}]' >/dev/null
# --ingress as documented: its flags and nginx's capabilities.
kubectl -n steelyard patch ds steelyard --type=json --patch-file "$repo/manifests/ingress/patch/ingress-on.json" >/dev/null
kubectl -n steelyard rollout status ds/steelyard --timeout=3m >/dev/null
kubectl wait --for=condition=Accepted --timeout=60s gatewayclass/steelyard >/dev/null
log "steelyard running with --gateway --ingress, $mode mode; running the suite ($profiles)"

version=$(git -C "$repo" describe --always --dirty 2>/dev/null || echo dev)
mkdir -p "$(dirname "$report")"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
set +e
nsenter --net="/var/run/netns/$netns" env KUBECONFIG="$KUBECONFIG" "$state/conformance.test" -test.run TestConformance -test.v -test.timeout 60m \
	--gateway-class=steelyard --conformance-profiles="$profiles" --supported-features="$features" \
	--skip-tests="$skip" --report-output="$report" --cleanup-base-resources=false --mode="$mode" \
	--organization=steelyard-net --project=steelyard --url=https://github.com/steelyard-net/steelyard \
	--version="$version" --contact=https://github.com/steelyard-net/steelyard/issues 2>&1 | tee "$state/suite.log" >&2
rc=${PIPESTATUS[0]}
set -e
if [[ -s $report ]]; then
	# Not part of the upstream report: the machine is shared, so its load
	# goes with the figures (test/docsgen prints it).
	printf 'steelyardLoadAverage:\n  start: "%s"\n  end: "%s"\n' "$load_start" "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$report"
fi
cp "$state/suite.log" "${SUITE_LOG:-/tmp/steelyard-gwconf-suite.log}"
log "suite exit $rc; report $report; log ${SUITE_LOG:-/tmp/steelyard-gwconf-suite.log}"
exit "$rc"
