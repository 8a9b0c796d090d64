package ebpf

// The socket programs, compiled by Debian's clang through bpf2go (the
// version go.mod pins). The generated socklb_bpfel.go and .o are
// committed so that `go build` needs no clang; `make bpf-check`
// regenerates them (with BPF2GO_CFLAGS from the Makefile: the include
// directory of the host's asm/ headers) and fails on a difference.
//go:generate go tool bpf2go -tags linux -target bpfel socklb bpf/socklb.c
