# steelyard node agent image: multi-stage, a slim Debian runtime with the
# kernel tools the dataplanes and operators use.
#
# Without a registry (the real-node suite, `make node`), scripts/node/images.sh
# builds the same runtime stage from Debian packages (debootstrap) and the
# same binaries; README "Try it on a real node" lists the differences. Keep
# the package list below and scripts/node/rootfs.sh's in step.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/steelyard ./cmd/steelyard
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.buildVersion=${VERSION}" -o /out/steelyard-cni ./cmd/steelyard-cni

FROM debian:bookworm-slim
# iptables brings both flavours (nft and legacy): steelyard detects the one
# the node uses. ipset and ipvsadm for the IPVS dataplane, conntrack for
# flow cleanup and debugging, nft for the nftables dataplane (it drives
# nft -f), nginx for the L7 layer, bpftool to read the ebpf mode's pinned
# maps (bpftool map dump pinned /sys/fs/bpf/steelyard/services).
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables ipset ipvsadm conntrack iproute2 nftables nginx-light bpftool \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/steelyard /usr/local/bin/steelyard
# The chained CNI plugin; `steelyard install-cni` (the DaemonSet's init
# container) copies it onto the node.
COPY --from=build /out/steelyard-cni /usr/local/bin/steelyard-cni
ENTRYPOINT ["/usr/local/bin/steelyard"]
CMD ["run"]
