package dataplane

// Dataplane programs a desired State into the kernel of the network namespace
// it runs in, and reads the kernel back for the operator CLI.
//
// Sync is the only place that writes: the agent's sync loop calls it with the
// whole desired state, and the dataplane applies it atomically (one
// iptables-restore, one nft transaction, one IPVS difference). A failed Sync
// leaves the previously applied state in place.
type Dataplane interface {
	// Sync applies s. With full, every object steelyard owns is rewritten
	// (which also repairs rules someone changed by hand); otherwise only what
	// changed since the last successful Sync is written.
	Sync(s State, full bool) error
	// Explain reads only the live kernel and returns what each VIP does.
	Explain() ([]ServiceView, error)
	// Cleanup removes everything steelyard created and nothing else.
	Cleanup() error
}
