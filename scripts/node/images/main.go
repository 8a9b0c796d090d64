// Command images assembles one container image from local pieces and
// writes it as a docker-archive tarball (what `ctr images import` and
// `docker load` read), tagged with the given name. Nothing is pulled.
//
//	images --name registry.k8s.io/pause:3.10.2 --out pause.tar \
//	    --file /tmp/pause:/pause:0755 --entrypoint /pause
//
// --layer adds an existing tar file (a root filesystem) as a layer;
// --file adds host files into one more layer on top; --registry adds an
// image of a docker-archive tarball in the layout agnhost's
// fake-registry-server serves from /var/registry (a tag file holding the
// manifest's digest, manifests and blobs under sha256/<2>/<hash>/data),
// which upstream's agnhost image fills from registry.k8s.io at build time
// and Kubernetes' e2e LocalhostNodePorts test pulls through a node port on
// localhost. The image is
// linux/amd64 (runtime.GOARCH) with the given entrypoint, command and
// environment.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(s string) error { *l = append(*l, s); return nil }

func main() {
	var layers, files, registry, entrypoint, cmd, env list
	ref := flag.String("name", "", "image reference to tag the image with (required)")
	out := flag.String("out", "", "docker-archive tarball to write (required)")
	workdir := flag.String("workdir", "", "working directory")
	flag.Var(&layers, "layer", "tar file to add as a layer (repeatable, bottom first)")
	flag.Var(&files, "file", "SRC:DST[:MODE] host file to add in a top layer (repeatable)")
	flag.Var(&registry, "registry", "IMAGE.tar:NAME:TAG docker-archive image to serve as NAME:TAG from /var/registry (agnhost fake-registry-server's layout; repeatable)")
	flag.Var(&entrypoint, "entrypoint", "entrypoint argument (repeatable)")
	flag.Var(&cmd, "cmd", "command argument (repeatable)")
	flag.Var(&env, "env", "KEY=VALUE (repeatable)")
	flag.Parse()
	if *ref == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "images: --name and --out are required")
		os.Exit(2)
	}
	entries, err := hostFiles(files)
	if err == nil {
		for _, r := range registry {
			var more []entry
			if more, err = registryFiles(r); err != nil {
				break
			}
			entries = append(entries, more...)
		}
	}
	if err == nil {
		err = build(*ref, *out, *workdir, layers, entries, entrypoint, cmd, env)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "images: %v\n", err)
		os.Exit(1)
	}
}

func build(ref, out, workdir string, layers []string, files []entry, entrypoint, cmd, env []string) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	img := mutate.MediaType(empty.Image, "application/vnd.docker.distribution.manifest.v2+json")
	for _, l := range layers {
		layer, err := tarball.LayerFromFile(l)
		if err != nil {
			return fmt.Errorf("layer %s: %w", l, err)
		}
		if img, err = mutate.AppendLayers(img, layer); err != nil {
			return err
		}
	}
	if len(files) > 0 {
		data, err := filesTar(files)
		if err != nil {
			return err
		}
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(data)), nil
		})
		if err != nil {
			return err
		}
		if img, err = mutate.AppendLayers(img, layer); err != nil {
			return err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.WorkingDir = entrypoint, cmd, workdir
	cf.Config.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	f, err := os.Create(out + ".tmp")
	if err != nil {
		return err
	}
	defer os.Remove(out + ".tmp")
	if err := tarball.Write(tag, img, f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(out+".tmp", out)
}

// entry is one regular file of the top layer.
type entry struct {
	name string // path in the image, without the leading slash
	mode int64
	data []byte
}

// hostFiles reads the --file specs.
func hostFiles(specs []string) ([]entry, error) {
	var out []entry
	for _, spec := range specs {
		parts := strings.Split(spec, ":")
		if len(parts) < 2 || len(parts) > 3 {
			return nil, fmt.Errorf("--file %q: want SRC:DST[:MODE]", spec)
		}
		mode := int64(0o755)
		if len(parts) == 3 {
			m, err := strconv.ParseInt(parts[2], 8, 32)
			if err != nil {
				return nil, fmt.Errorf("--file %q: mode: %w", spec, err)
			}
			mode = m
		}
		data, err := os.ReadFile(parts[0])
		if err != nil {
			return nil, err
		}
		out = append(out, entry{name: strings.TrimPrefix(path.Clean(parts[1]), "/"), mode: mode, data: data})
	}
	return out, nil
}

// registryFiles lays out one image for fake-registry-server: the tag file
// with the manifest's digest, the manifest, the config and the layers,
// each under <kind>/sha256/<first two hex>/<hash>/data.
func registryFiles(spec string) ([]entry, error) {
	parts := strings.Split(spec, ":")
	if len(parts) != 3 {
		return nil, fmt.Errorf("--registry %q: want IMAGE.tar:NAME:TAG", spec)
	}
	img, err := tarball.ImageFromPath(parts[0], nil)
	if err != nil {
		return nil, fmt.Errorf("--registry %q: %w", spec, err)
	}
	base := path.Join("var/registry", parts[1])
	at := func(kind string, d v1.Hash) string {
		return path.Join(base, kind, d.Algorithm, d.Hex[:2], d.Hex, "data")
	}
	manifest, err := img.RawManifest()
	if err != nil {
		return nil, err
	}
	digest, err := img.Digest()
	if err != nil {
		return nil, err
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return nil, err
	}
	configName, err := img.ConfigName()
	if err != nil {
		return nil, err
	}
	out := []entry{
		{name: path.Join(base, "manifests", parts[2]), mode: 0o644, data: []byte(digest.String() + "\n")},
		{name: at("manifests", digest), mode: 0o644, data: manifest},
		{name: at("blobs", configName), mode: 0o644, data: config},
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return nil, err
		}
		rc, err := l.Compressed()
		if err != nil {
			return nil, err
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, entry{name: at("blobs", d), mode: 0o644, data: data})
	}
	return out, nil
}

// filesTar makes one layer of the entries, with their parent directories.
func filesTar(files []entry) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		dst := f.name
		var parents []string
		for d := path.Dir(dst); d != "." && d != "/" && !dirs[d]; d = path.Dir(d) {
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
				return nil, err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: dst, Mode: f.mode, Size: int64(len(f.data)), ModTime: time.Unix(0, 0)}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
