// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// steelyard's socket-layer load balancer: cgroup sock_addr programs that
// pick a Service port's backend when a process connects (TCP) or sends an
// unconnected UDP datagram, so packets leave already addressed to the pod
// and conntrack never sees the VIP.
//
// Maps (the Go side, dataplane/ebpf/maps.go, encodes the same layouts):
//
//	services  (addr, port, proto) -> (table id, slot count, affinity s)
//	slots     (table id, slot)    -> backend (addr, port)
//	revnat    (socket cookie, backend addr, port) -> VIP (addr, port)
//	counts    (VIP, backend)     -> per-CPU count of the backend's choices
//	names     VIP                -> its Service port's name (for the counts)
//	members   (VIP, backend)     -> present: a backend of a ClientIP port
//	affinity  (netns, client, VIP) -> backend and when it was last chosen
//
// Addresses are 16 bytes, IPv4 as ::ffff:a.b.c.d, so one key layout
// serves both families (and AF_INET6 sockets that dial a v4-mapped VIP).
// Ports are in network byte order, as bpf_sock_addr holds them.
#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

// From <linux/net.h>, which is not a UAPI header.
#define SOCK_STREAM 1
#define SOCK_DGRAM 2

char __license[] SEC("license") = "Dual BSD/GPL";

struct svc_key {
	__u32 addr[4];
	__u16 port; // network order
	__u8 proto; // IPPROTO_TCP or IPPROTO_UDP
	__u8 pad;
};

struct svc_val {
	__u32 id;       // the Service port's slot table
	__u32 count;    // slots in it, >= 1
	__u32 affinity; // sessionAffinity ClientIP timeout in seconds; 0: none
	__u32 pad;
};

struct slot_key {
	__u32 id;
	__u32 slot;
};

struct backend {
	__u32 addr[4];
	__u16 port; // network order
	__u16 pad;
};

struct revnat_key {
	__u64 cookie;
	__u32 addr[4];
	__u16 port;
	__u16 pad;
	__u32 pad2;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct svc_key);
	__type(value, struct svc_val);
} services SEC(".maps");

// Filled on demand: a table has as many entries as its slots.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 20);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct slot_key);
	__type(value, struct backend);
} slots SEC(".maps");

// What a socket was sent to instead of the VIP: recvmsg and getpeername
// show the VIP again. LRU: a socket that outlives its entry shows the pod.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct revnat_key);
	__type(value, struct backend);
} revnat SEC(".maps");

// The choices counted per VIP and backend, with --count-connections: the
// key names no table or slot, so a table switched under a new ID (a weight
// change, an endpoint that comes or goes) keeps the counts of the backends
// that stay. The agent creates each entry (zero) before a table names the
// backend and deletes it when the backend leaves the VIP: the programs
// only add. Per CPU: no cache line shared between CPUs on the hot path.
struct count_key {
	struct svc_key vip;
	struct backend be;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 1 << 20);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct count_key);
	__type(value, __u64);
} counts SEC(".maps");

// The Service port of each counted VIP ("namespace/name:port", shortened
// as nft comments are): read by the agent only, so that the counts carry
// the names the nftables half's counters have.
struct svc_name {
	char name[128];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct svc_key);
	__type(value, struct svc_name);
} names SEC(".maps");

// Set by the agent at load (--count-connections). A constant: without it
// the verifier removes the counting code, so the default costs nothing.
volatile const __u32 count_connections = 0;

static __always_inline void count(const struct svc_key *vip, const struct backend *be)
{
	if (!count_connections)
		return;
	struct count_key ck;
	__builtin_memcpy(&ck.vip, vip, sizeof(ck.vip));
	__builtin_memcpy(&ck.be, be, sizeof(ck.be));
	__u64 *n = bpf_map_lookup_elem(&counts, &ck);
	if (n)
		__sync_fetch_and_add(n, 1);
}

// sessionAffinity ClientIP. At connect() an unbound socket has no source
// address yet (routing picks it later), so the client is its network
// namespace (a pod: its address) plus the address it bound, if any. An
// entry is used while younger than the Service's timeout and while its
// backend is still in members (the agent writes there the backends of an
// affinity port that have slots, before it switches the table): a backend
// that left, or whose weight became 0, is never returned, as in the
// nftables mode, whose affinity rules name the active endpoints only. Each
// use restarts the timeout, as the other modes' affinity sets do at each
// new connection.
struct aff_key {
	__u64 netns;
	__u32 client[4];
	struct svc_key vip;
	__u32 pad;
};

struct aff_val {
	struct backend be;
	__u32 pad;
	__u64 at; // bpf_ktime_get_boot_ns() of the last choice
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct aff_key);
	__type(value, struct aff_val);
} affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 20);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct count_key);
	__type(value, __u8);
} members SEC(".maps");

static __always_inline void v4_mapped(__u32 addr[4], __u32 ip4)
{
	addr[0] = 0;
	addr[1] = 0;
	addr[2] = bpf_htonl(0xffff);
	addr[3] = ip4;
}

// The four words of an IPv6 address in bpf_sock_addr (32-bit accesses
// only, as the verifier wants them).
static __always_inline void load6(__u32 addr[4], struct bpf_sock_addr *ctx)
{
	addr[0] = ctx->user_ip6[0];
	addr[1] = ctx->user_ip6[1];
	addr[2] = ctx->user_ip6[2];
	addr[3] = ctx->user_ip6[3];
}

static __always_inline void store6(struct bpf_sock_addr *ctx, const __u32 addr[4])
{
	ctx->user_ip6[0] = addr[0];
	ctx->user_ip6[1] = addr[1];
	ctx->user_ip6[2] = addr[2];
	ctx->user_ip6[3] = addr[3];
}

static __always_inline int is_member(const struct svc_key *vip, const struct backend *be)
{
	struct count_key mk;
	__builtin_memcpy(&mk.vip, vip, sizeof(mk.vip));
	__builtin_memcpy(&mk.be, be, sizeof(mk.be));
	return bpf_map_lookup_elem(&members, &mk) != NULL;
}

// client fills the affinity key's client: the socket's network namespace
// and the address it is bound to (zero when unbound).
static __always_inline void client(struct bpf_sock_addr *ctx, struct aff_key *ak, int v6)
{
	struct bpf_sock *sk = ctx->sk;
	ak->netns = bpf_get_netns_cookie(ctx);
	if (!sk)
		return;
	if (v6) {
		ak->client[0] = sk->src_ip6[0];
		ak->client[1] = sk->src_ip6[1];
		ak->client[2] = sk->src_ip6[2];
		ak->client[3] = sk->src_ip6[3];
	} else if (sk->src_ip4) {
		v4_mapped(ak->client, sk->src_ip4);
	}
}

// pick writes the backend for the VIP in key to out: the client's
// affinity entry when it holds, else a slot chosen at random. 0: not ours
// (the packet goes on to the nftables rules unchanged).
static __always_inline int pick(struct bpf_sock_addr *ctx, struct svc_key *key, struct backend *out, int v6)
{
	struct svc_val *svc = bpf_map_lookup_elem(&services, key);
	if (!svc || svc->count == 0)
		return 0;
	__u64 timeout = (__u64)svc->affinity * 1000000000ULL;
	struct aff_key ak = {};
	__u64 now = 0;
	if (timeout) {
		client(ctx, &ak, v6);
		__builtin_memcpy(&ak.vip, key, sizeof(ak.vip));
		now = bpf_ktime_get_boot_ns();
		struct aff_val *av = bpf_map_lookup_elem(&affinity, &ak);
		if (av && now - av->at <= timeout && is_member(key, &av->be)) {
			__builtin_memcpy(out, &av->be, sizeof(*out));
			av->at = now;
			return 1;
		}
	}
	struct slot_key sk = {
		.id = svc->id,
		.slot = bpf_get_prandom_u32() % svc->count,
	};
	struct backend *be = bpf_map_lookup_elem(&slots, &sk);
	if (!be)
		return 0;
	__builtin_memcpy(out, be, sizeof(*out));
	if (timeout) {
		struct aff_val nv = {.at = now};
		__builtin_memcpy(&nv.be, be, sizeof(nv.be));
		bpf_map_update_elem(&affinity, &ak, &nv, BPF_ANY);
	}
	return 1;
}

static __always_inline void remember(void *ctx, struct backend *be, struct svc_key *vip)
{
	struct revnat_key rk = {.cookie = bpf_get_socket_cookie(ctx), .port = be->port};
	struct backend orig = {.port = vip->port};
	__builtin_memcpy(rk.addr, be->addr, sizeof(rk.addr));
	__builtin_memcpy(orig.addr, vip->addr, sizeof(orig.addr));
	bpf_map_update_elem(&revnat, &rk, &orig, BPF_ANY);
}

static __always_inline __u8 l4proto(struct bpf_sock_addr *ctx)
{
	if (ctx->type == SOCK_STREAM)
		return IPPROTO_TCP;
	if (ctx->type == SOCK_DGRAM)
		return IPPROTO_UDP;
	return 0;
}

// at_connect: a connected UDP socket is left to the nftables rules. Its
// backend would be fixed for the socket's life, and nothing closes it when
// that pod leaves (no conntrack entry to flush; bpf_sock_destroy needs
// 6.5 and an iterator per network namespace): through the VIP, the
// agent's conntrack cleanup moves the flow. Unconnected sends choose
// again at each sendmsg().
static __always_inline int skip(__u8 proto, int at_connect)
{
	return !proto || (at_connect && proto == IPPROTO_UDP);
}

static __always_inline int xlate4(struct bpf_sock_addr *ctx, int at_connect)
{
	struct svc_key key = {.port = (__u16)ctx->user_port, .proto = l4proto(ctx)};
	if (skip(key.proto, at_connect))
		return 1;
	v4_mapped(key.addr, ctx->user_ip4);
	struct backend be;
	if (!pick(ctx, &key, &be, 0))
		return 1;
	ctx->user_ip4 = be.addr[3];
	ctx->user_port = be.port;
	remember(ctx, &be, &key);
	count(&key, &be);
	return 1;
}

static __always_inline int xlate6(struct bpf_sock_addr *ctx, int at_connect)
{
	struct svc_key key = {.port = (__u16)ctx->user_port, .proto = l4proto(ctx)};
	if (skip(key.proto, at_connect))
		return 1;
	load6(key.addr, ctx);
	struct backend be;
	if (!pick(ctx, &key, &be, 1))
		return 1;
	store6(ctx, be.addr);
	ctx->user_port = be.port;
	remember(ctx, &be, &key);
	count(&key, &be);
	return 1;
}

// rev4/rev6 put the VIP back where the socket sees its peer.
static __always_inline int rev4(struct bpf_sock_addr *ctx)
{
	struct revnat_key rk = {.cookie = bpf_get_socket_cookie(ctx), .port = (__u16)ctx->user_port};
	v4_mapped(rk.addr, ctx->user_ip4);
	struct backend *vip = bpf_map_lookup_elem(&revnat, &rk);
	if (!vip)
		return 1;
	ctx->user_ip4 = vip->addr[3];
	ctx->user_port = vip->port;
	return 1;
}

static __always_inline int rev6(struct bpf_sock_addr *ctx)
{
	struct revnat_key rk = {.cookie = bpf_get_socket_cookie(ctx), .port = (__u16)ctx->user_port};
	load6(rk.addr, ctx);
	struct backend *vip = bpf_map_lookup_elem(&revnat, &rk);
	if (!vip)
		return 1;
	store6(ctx, vip->addr);
	ctx->user_port = vip->port;
	return 1;
}

SEC("cgroup/connect4")
int sy_connect4(struct bpf_sock_addr *ctx) { return xlate4(ctx, 1); }

SEC("cgroup/connect6")
int sy_connect6(struct bpf_sock_addr *ctx) { return xlate6(ctx, 1); }

SEC("cgroup/sendmsg4")
int sy_sendmsg4(struct bpf_sock_addr *ctx) { return xlate4(ctx, 0); }

SEC("cgroup/sendmsg6")
int sy_sendmsg6(struct bpf_sock_addr *ctx) { return xlate6(ctx, 0); }

SEC("cgroup/recvmsg4")
int sy_recvmsg4(struct bpf_sock_addr *ctx) { return rev4(ctx); }

SEC("cgroup/recvmsg6")
int sy_recvmsg6(struct bpf_sock_addr *ctx) { return rev6(ctx); }

SEC("cgroup/getpeername4")
int sy_getpeername4(struct bpf_sock_addr *ctx) { return rev4(ctx); }

SEC("cgroup/getpeername6")
int sy_getpeername6(struct bpf_sock_addr *ctx) { return rev6(ctx); }
