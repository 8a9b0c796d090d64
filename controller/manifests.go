package controller

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/clock"
)

// defaultNamespace is the namespace of a manifest object that names none, as
// with kubectl apply.
const defaultNamespace = "default"

// defaultDebounce merges the burst of events one save or one ConfigMap update
// produces into a single reload.
const defaultDebounce = 100 * time.Millisecond

// ManifestSource reads Services and EndpointSlices from a directory of
// manifests: the standalone ("embedded default") source, used without an API
// server. Files are *.yaml, *.yml and *.json (hidden files are skipped; so are
// subdirectories), each holding one or more documents ("---"), a v1 List, a
// ServiceList or an EndpointSliceList. Objects of other kinds are ignored.
//
// A file that fails to parse keeps contributing the objects of its last
// successful parse, so a half-written file never drops Services; a deleted
// file drops its objects. The objects returned are shared: callers must not
// modify them.
type ManifestSource struct {
	dir string

	// debounce, clock and ready are fields so tests can set the one, run
	// the debounce timer on a fake clock and learn when the watch is in
	// place.
	debounce time.Duration
	clock    clock.Clock
	ready    func()

	mu sync.Mutex
	// files holds the objects of the last successful parse of each file, by
	// path.
	files map[string]manifestObjects
}

type manifestObjects struct {
	services []*corev1.Service
	slices   []*discoveryv1.EndpointSlice
}

// NewManifestSource returns a source reading dir. Nothing is read until Load.
func NewManifestSource(dir string) *ManifestSource {
	return &ManifestSource{dir: dir, debounce: defaultDebounce, clock: clock.RealClock{}, files: map[string]manifestObjects{}}
}

// Load reads every manifest file of the directory and returns the objects of
// all files (in file name order, then document order), and one error per
// file that could not be read or parsed (naming the file and, for a parse
// error, the 1-based document index). An error reading the directory itself
// keeps every file's last objects. Load is safe for concurrent use.
func (m *ManifestSource) Load() (services []*corev1.Service, slices []*discoveryv1.EndpointSlice, errs []error) {
	m.mu.Lock()
	defer m.mu.Unlock()

	paths, err := m.list()
	if err != nil {
		errs = append(errs, err)
		paths = nil
		for p := range m.files {
			paths = append(paths, p)
		}
		sort.Strings(paths)
	} else {
		// A file that is gone takes its objects with it.
		present := make(map[string]bool, len(paths))
		for _, p := range paths {
			present[p] = true
		}
		for p := range m.files {
			if !present[p] {
				log.WithField(fieldFile, p).Debug("manifest removed")
				delete(m.files, p)
			}
		}
		for _, p := range paths {
			objs, err := parseManifestFile(p)
			if errors.Is(err, errEmptyFile) {
				if prev := m.files[p]; len(prev.services)+len(prev.slices) == 0 {
					err = nil // it was empty before too: nothing to keep
				}
			}
			if err != nil {
				errs = append(errs, err)
				continue // keep the last good objects of p, if any
			}
			m.files[p] = objs
		}
	}
	for _, p := range paths {
		objs := m.files[p]
		services = append(services, objs.services...)
		slices = append(slices, objs.slices...)
	}
	return services, slices, errs
}

// list returns the manifest files of the directory, sorted. Symbolic links
// are followed, because a mounted ConfigMap is made of them.
func (m *ManifestSource) list() ([]string, error) {
	entries, err := os.ReadDir(m.dir)
	if err != nil {
		return nil, fmt.Errorf("reading manifest directory: %w", err)
	}
	var paths []string
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !isManifestName(name) {
			continue
		}
		p := filepath.Join(m.dir, name)
		fi, err := os.Stat(p)
		if err != nil || !fi.Mode().IsRegular() {
			// A dangling link mid-swap, or a directory: nothing to read.
			continue
		}
		paths = append(paths, p)
	}
	sort.Strings(paths)
	return paths, nil
}

func isManifestName(name string) bool {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// errEmptyFile is returned for a file with nothing but white space: most
// likely one being rewritten (truncated, not yet written), so Load keeps its
// previous objects rather than dropping its Services for a moment.
var errEmptyFile = errors.New("file is empty (being written?), keeping its previous objects")

// parseManifestFile decodes every document of one file. Any error fails the
// whole file, so a file is never half applied.
func parseManifestFile(path string) (manifestObjects, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return manifestObjects{}, fmt.Errorf("%s: %w", path, err)
	}
	return parseManifest(path, data)
}

// parseManifest decodes the documents of data, read from path (named in
// errors). It is the fuzzed entry point (FuzzManifests).
func parseManifest(path string, data []byte) (manifestObjects, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return manifestObjects{}, fmt.Errorf("%s: %w", path, errEmptyFile)
	}
	var objs manifestObjects
	// The YAML reader also returns a JSON file as one document.
	r := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for doc := 1; ; doc++ {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return manifestObjects{}, fmt.Errorf("%s: document %d: %w", path, doc, err)
		}
		if err := objs.decode(path, doc, raw); err != nil {
			return manifestObjects{}, fmt.Errorf("%s: document %d: %w", path, doc, err)
		}
	}
	return objs, nil
}

// decode adds the objects of one document to objs.
func (objs *manifestObjects) decode(path string, doc int, raw []byte) error {
	// Empty documents (a leading "---", comments only) are allowed, as in
	// kubectl.
	if js, err := yaml.ToJSON(raw); err == nil && (len(bytes.TrimSpace(js)) == 0 || string(bytes.TrimSpace(js)) == "null") {
		return nil
	}
	obj, gvk, err := scheme.Codecs.UniversalDeserializer().Decode(raw, nil, nil)
	if runtime.IsNotRegisteredError(err) {
		// A kind client-go does not know (a CRD, say): not ours. The
		// decoder returns no kind with this error, so read it again.
		var tm metav1.TypeMeta
		_ = yaml.Unmarshal(raw, &tm)
		log.WithFields(logrus.Fields{fieldFile: path, fieldDoc: doc, fieldKind: tm.APIVersion + "/" + tm.Kind}).Debug("manifest kind not used, ignored")
		return nil
	}
	if err != nil {
		return err
	}
	switch o := obj.(type) {
	case *corev1.Service:
		if o.Namespace == "" {
			o.Namespace = defaultNamespace
		}
		objs.services = append(objs.services, o)
	case *discoveryv1.EndpointSlice:
		if o.Namespace == "" {
			o.Namespace = defaultNamespace
		}
		objs.slices = append(objs.slices, o)
	case *corev1.List:
		for i, item := range o.Items {
			if err := objs.decode(path, doc, item.Raw); err != nil {
				return fmt.Errorf("List item %d: %w", i+1, err)
			}
		}
	case *corev1.ServiceList:
		for i := range o.Items {
			svc := &o.Items[i]
			if svc.Namespace == "" {
				svc.Namespace = defaultNamespace
			}
			objs.services = append(objs.services, svc)
		}
	case *discoveryv1.EndpointSliceList:
		for i := range o.Items {
			sl := &o.Items[i]
			if sl.Namespace == "" {
				sl.Namespace = defaultNamespace
			}
			objs.slices = append(objs.slices, sl)
		}
	default:
		kind := obj.GetObjectKind().GroupVersionKind()
		if gvk != nil {
			kind = *gvk
		}
		log.WithFields(logrus.Fields{fieldFile: path, fieldDoc: doc, fieldKind: kind.GroupVersion().String() + "/" + kind.Kind}).Debug("manifest kind not used, ignored")
	}
	return nil
}

// Watch calls changed (from Watch's goroutine) about 100 ms after the last of
// a burst of changes in the directory, until ctx is done; the caller then
// calls Load. The whole directory is watched rather than single files, which
// covers editors that write a temporary file and rename it over the original
// and the "..data" symlink swap of a mounted ConfigMap. Watch returns nil when
// ctx is done, or an error if the watch cannot be set up.
func (m *ManifestSource) Watch(ctx context.Context, changed func()) error {
	w, err := m.watcher()
	if err != nil {
		return err
	}
	defer w.Close()
	return m.watchLoop(ctx, w.Events, w.Errors, changed)
}

// StartWatch is Watch for the agent: the watch is in place when it returns
// (so a change made right after cannot be missed by the first Load), and
// the loop goes on in its own goroutine until ctx is done.
func (m *ManifestSource) StartWatch(ctx context.Context, changed func()) error {
	w, err := m.watcher()
	if err != nil {
		return err
	}
	go func() {
		defer w.Close()
		_ = m.watchLoop(ctx, w.Events, w.Errors, changed)
	}()
	return nil
}

func (m *ManifestSource) watcher() (*fsnotify.Watcher, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watching manifests: %w", err)
	}
	if err := w.Add(m.dir); err != nil {
		w.Close()
		return nil, fmt.Errorf("watching manifest directory %s: %w", m.dir, err)
	}
	if m.ready != nil {
		m.ready()
	}
	return w, nil
}

// watchLoop takes the watcher's channels rather than the watcher, so a
// test can feed it events one by one.
func (m *ManifestSource) watchLoop(ctx context.Context, events <-chan fsnotify.Event, errs <-chan error, changed func()) error {
	timer := m.clock.NewTimer(m.debounce)
	timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				return nil
			}
			if ev.Op == fsnotify.Chmod {
				continue // attribute changes only: contents are the same
			}
			log.WithField(fieldFile, ev.Name).Debugf("manifest directory event %s", ev.Op)
			timer.Reset(m.debounce)
		case err, ok := <-errs:
			if !ok {
				return nil
			}
			// Usually an event queue overflow: events were lost, so reload
			// everything to be safe.
			log.WithError(err).Warn("manifest watch error, reloading")
			timer.Reset(m.debounce)
		case <-timer.C():
			changed()
		}
	}
}
