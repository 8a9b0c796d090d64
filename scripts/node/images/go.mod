// Image builder for the real-node suite (scripts/node/images.sh): assembles
// OCI images from local files and layers with go-containerregistry and
// writes them as docker-archive tarballs for `ctr images import`. A module
// of its own so the steelyard module does not depend on it.
module github.com/steelyard-net/steelyard/scripts/node/images

go 1.26.8

require github.com/google/go-containerregistry v0.22.1

require (
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
)
