package controlplane

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// ServiceClusterIPRange is kube-apiserver's --service-cluster-ip-range:
// the sandbox's VIP range (RFC 2544), so ClusterIPs it allocates are
// addresses the sandbox routes.
const ServiceClusterIPRange = "198.18.0.0/16"

// ServiceAccountIssuer is kube-apiserver's --service-account-issuer.
const ServiceAccountIssuer = "https://kubernetes.default.svc"

// Grace periods between SIGTERM and SIGKILL.
const (
	apiserverGrace = 15 * time.Second
	etcdGrace      = 10 * time.Second
)

// ReducedRuntimeConfig is the --runtime-config of WithReducedAPIs: it turns
// off API groups that nothing steelyard runs or tests uses, which saves
// kube-apiserver memory. Kept on, among others: core v1, discovery.k8s.io
// (EndpointSlices), networking.k8s.io (Ingress, ServiceCIDR, IPAddress),
// rbac, authentication/authorization, coordination (the apiserver's own
// leases), and what kube-apiserver needs to become ready: apiregistration,
// apiextensions, storage.k8s.io, node.k8s.io, flowcontrol, and (verified
// with v1.37.2) admissionregistration and scheduling.k8s.io. It saves about
// 40 MiB of kube-apiserver's 270 MiB idle RSS.
const ReducedRuntimeConfig = "apps/v1=false,batch/v1=false,autoscaling/v1=false,autoscaling/v2=false," +
	"policy/v1=false,certificates.k8s.io/v1=false,events.k8s.io/v1=false,resource.k8s.io/v1=false"

// Options configure a control plane; the zero value is ready to use.
type Options struct {
	// Binaries to run; FindBinaries when KubeAPIServer is empty.
	Binaries Binaries
	// ReadyTimeout bounds each wait for etcd and kube-apiserver to become
	// ready (default 60 s).
	ReadyTimeout time.Duration
	// ReducedAPIs starts kube-apiserver with ReducedRuntimeConfig.
	ReducedAPIs bool
	// APIServerArgs are appended to kube-apiserver's arguments (a later
	// flag wins over an earlier one).
	APIServerArgs []string
	// Logf, when set, receives progress lines (start-up times).
	Logf func(format string, args ...any)
}

// ControlPlane is a running etcd and kube-apiserver. Its methods are safe
// for concurrent use.
type ControlPlane struct {
	// URL is kube-apiserver's address, https://127.0.0.1:<port>.
	URL string
	// Token is the admin's bearer token (user "admin", group
	// system:masters).
	Token string
	// Kubeconfig is the path of the admin's kubeconfig.
	Kubeconfig string
	// CAFile holds the certificate of the CA that signed kube-apiserver's
	// serving certificate (with the serving certificate before it).
	CAFile string
	// EtcdURL is etcd's client URL, http://127.0.0.1:<port>.
	EtcdURL string
	// Dir holds etcd's data, the keys, kubeconfigs and the logs
	// (etcd.log, kube-apiserver.log). Stop removes it.
	Dir string
	// Binaries are the executables in use (kubectl and kube-proxy too).
	Binaries Binaries

	opts          Options
	apiserverArgs []string
	caData        []byte

	mu          sync.Mutex
	etcd        *process
	apiserver   *process
	stopped     bool
	finalLogs   map[string]string // log tails kept by Stop
	kubeconfigs int
}

// StartProcess starts etcd and kube-apiserver and waits until
// kube-apiserver's /readyz says ok. ctx bounds only the start-up: the
// processes run until Stop. On error nothing is left running or on disk.
func StartProcess(ctx context.Context, opts Options) (*ControlPlane, error) {
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 60 * time.Second
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	bins := opts.Binaries
	if bins.KubeAPIServer == "" {
		var err error
		if bins, err = FindBinaries(); err != nil {
			return nil, err
		}
	}
	removeOrphanDirs()
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", dirPrefix, os.Getpid()))
	if err != nil {
		return nil, err
	}
	cp := &ControlPlane{
		Dir:        dir,
		Binaries:   bins,
		Kubeconfig: filepath.Join(dir, "kubeconfig"),
		CAFile:     filepath.Join(dir, "certs", "apiserver.crt"),
		opts:       opts,
	}
	if err := cp.start(ctx); err != nil {
		_ = cp.Stop()
		return nil, err
	}
	return cp, nil
}

func (cp *ControlPlane) start(ctx context.Context) error {
	start := time.Now()
	keyFile, tokenFile, err := cp.writeCredentials()
	if err != nil {
		return err
	}
	// The ports are free when picked but may be taken before the process
	// binds them; then try again with others.
	for attempt := 1; ; attempt++ {
		err := cp.startOnce(ctx, keyFile, tokenFile)
		if err == nil {
			break
		}
		if attempt == 3 || !errors.Is(err, errPortTaken) {
			return err
		}
		cp.opts.Logf("control plane: %s; retrying on other ports", strings.SplitN(err.Error(), "\n", 2)[0])
		cp.mu.Lock()
		cp.stopProcesses()
		cp.mu.Unlock()
		if err := os.RemoveAll(filepath.Join(cp.Dir, "etcd")); err != nil {
			return err
		}
	}
	cp.opts.Logf("control plane: ready in %v at %s (logs in %s)", time.Since(start).Round(time.Millisecond), cp.URL, cp.Dir)
	return cp.writeKubeconfig(cp.Kubeconfig, "admin", cp.Token)
}

var errPortTaken = errors.New("port taken")

func (cp *ControlPlane) startOnce(ctx context.Context, keyFile, tokenFile string) error {
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	cp.EtcdURL = "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	cp.URL = "https://127.0.0.1:" + strconv.Itoa(ports[2])

	t0 := time.Now()
	etcd, err := startProcess("etcd", cp.Binaries.Etcd, []string{
		"--name=steelyard",
		"--data-dir=" + filepath.Join(cp.Dir, "etcd"),
		"--listen-client-urls=" + cp.EtcdURL,
		"--advertise-client-urls=" + cp.EtcdURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=steelyard=" + peerURL,
		// Throw-away data: durability buys nothing and fsync latency
		// would show in every API write of a benchmark.
		"--unsafe-no-fsync",
		"--log-level=warn",
	}, filepath.Join(cp.Dir, "etcd.log"))
	if err != nil {
		return err
	}
	cp.mu.Lock()
	cp.etcd = etcd
	cp.mu.Unlock()
	if err := cp.waitEtcd(ctx, etcd); err != nil {
		return err
	}
	cp.opts.Logf("control plane: etcd %s ready in %v", EtcdVersion, time.Since(t0).Round(time.Millisecond))

	cp.apiserverArgs = []string{
		"--etcd-servers=" + cp.EtcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ports[2]),
		// Without it a loopback advertise address makes it exit.
		"--endpoint-reconciler-type=none",
		"--cert-dir=" + filepath.Dir(cp.CAFile),
		"--service-account-key-file=" + keyFile,
		"--service-account-signing-key-file=" + keyFile,
		"--service-account-issuer=" + ServiceAccountIssuer,
		"--service-cluster-ip-range=" + ServiceClusterIPRange,
		"--token-auth-file=" + tokenFile,
		"--authorization-mode=RBAC",
	}
	if cp.opts.ReducedAPIs {
		cp.apiserverArgs = append(cp.apiserverArgs, "--runtime-config="+ReducedRuntimeConfig)
	}
	cp.apiserverArgs = append(cp.apiserverArgs, cp.opts.APIServerArgs...)
	return cp.startAPIServer(ctx)
}

// startAPIServer starts kube-apiserver with cp.apiserverArgs and waits for
// /readyz.
func (cp *ControlPlane) startAPIServer(ctx context.Context) error {
	t0 := time.Now()
	p, err := startProcess("kube-apiserver", cp.Binaries.KubeAPIServer, cp.apiserverArgs,
		filepath.Join(cp.Dir, "kube-apiserver.log"))
	if err != nil {
		return err
	}
	cp.mu.Lock()
	cp.apiserver = p
	cp.mu.Unlock()
	if err := cp.waitAPIServer(ctx, p); err != nil {
		return err
	}
	cp.opts.Logf("control plane: kube-apiserver %s ready in %v", KubernetesVersion, time.Since(t0).Round(time.Millisecond))
	return nil
}

// StopAPIServer stops kube-apiserver alone (SIGTERM, SIGKILL after a grace
// period); etcd keeps running. It returns an error when kube-apiserver had
// already exited on its own.
func (cp *ControlPlane) StopAPIServer() error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.apiserver == nil {
		return errors.New("kube-apiserver is not running")
	}
	p := cp.apiserver
	cp.apiserver = nil
	if !p.running() {
		return fmt.Errorf("%w; log tail:\n%s", p.exitError(), p.tail(30))
	}
	p.stop(apiserverGrace)
	return nil
}

// RestartAPIServer starts kube-apiserver again after StopAPIServer, with
// the same port, etcd, certificates and credentials, and waits for /readyz.
// Clients and kubeconfigs made before stay valid.
func (cp *ControlPlane) RestartAPIServer(ctx context.Context) error {
	cp.mu.Lock()
	switch {
	case cp.stopped:
		cp.mu.Unlock()
		return errors.New("the control plane is stopped")
	case cp.apiserver != nil:
		cp.mu.Unlock()
		return errors.New("kube-apiserver is running: StopAPIServer first")
	case !cp.etcd.running():
		cp.mu.Unlock()
		return fmt.Errorf("cannot restart kube-apiserver: %w", cp.etcd.exitError())
	}
	cp.mu.Unlock()
	return cp.startAPIServer(ctx)
}

// Stop stops kube-apiserver, then etcd (SIGTERM, SIGKILL after a grace
// period), and removes Dir. It may be called more than once.
func (cp *ControlPlane) Stop() error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.stopped {
		return nil
	}
	cp.stopped = true
	cp.stopProcesses()
	cp.finalLogs = cp.readLogs(logLinesKept)
	return os.RemoveAll(cp.Dir)
}

// stopProcesses stops kube-apiserver before etcd: a kube-apiserver whose
// etcd is gone may ignore SIGTERM. cp.mu must be held.
func (cp *ControlPlane) stopProcesses() {
	if cp.apiserver != nil {
		cp.apiserver.stop(apiserverGrace)
		cp.apiserver = nil
	}
	if cp.etcd != nil {
		cp.etcd.stop(etcdGrace)
		cp.etcd = nil
	}
}

// logLinesKept is how much of each log Stop keeps for Logs.
const logLinesKept = 200

// Logs returns the last n lines of each log, for failure reports. After
// Stop (which removes the files) it returns what Stop kept, at most 200
// lines each.
func (cp *ControlPlane) Logs(n int) string {
	cp.mu.Lock()
	stopped, final := cp.stopped, cp.finalLogs
	cp.mu.Unlock()
	if !stopped {
		final = cp.readLogs(n)
	}
	var b strings.Builder
	for _, name := range logNames {
		fmt.Fprintf(&b, "--- %s, last lines:\n%s\n", name, lastLines(final[name], n))
	}
	return b.String()
}

var logNames = []string{"kube-apiserver.log", "etcd.log"}

func (cp *ControlPlane) readLogs(n int) map[string]string {
	logs := make(map[string]string)
	for _, name := range logNames {
		logs[name] = tailFile(filepath.Join(cp.Dir, name), n)
	}
	return logs
}

// RESTConfig returns a new admin client configuration. Client-side rate
// limiting is effectively off (QPS 1000, burst 2000), so benchmarks
// measure the server, not client-go's default 5 QPS.
func (cp *ControlPlane) RESTConfig() *rest.Config {
	return &rest.Config{
		Host:            cp.URL,
		BearerToken:     cp.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: append([]byte(nil), cp.caData...)},
		QPS:             1000,
		Burst:           2000,
	}
}

// Client returns a new admin clientset.
func (cp *ControlPlane) Client() kubernetes.Interface {
	c, err := kubernetes.NewForConfig(cp.RESTConfig())
	if err != nil {
		panic(fmt.Sprintf("controlplane: client for %s: %v", cp.URL, err)) // cannot happen with our config
	}
	return c
}

// TokenKubeconfig writes a kubeconfig in Dir that authenticates with
// token (a ServiceAccount's, say) and returns its path.
func (cp *ControlPlane) TokenKubeconfig(token string) (string, error) {
	cp.mu.Lock()
	cp.kubeconfigs++
	n := cp.kubeconfigs
	cp.mu.Unlock()
	path := filepath.Join(cp.Dir, fmt.Sprintf("kubeconfig-%d", n))
	return path, cp.writeKubeconfig(path, fmt.Sprintf("token-%d", n), token)
}

func (cp *ControlPlane) writeKubeconfig(path, user, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["steelyard"] = &clientcmdapi.Cluster{Server: cp.URL, CertificateAuthorityData: cp.caData}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["steelyard"] = &clientcmdapi.Context{Cluster: "steelyard", AuthInfo: user}
	cfg.CurrentContext = "steelyard"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

// writeCredentials writes the service-account signing key and the static
// token file with a fresh admin token.
func (cp *ControlPlane) writeCredentials() (keyFile, tokenFile string, err error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", "", err
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", "", err
	}
	keyFile = filepath.Join(cp.Dir, "service-account.key")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return "", "", err
	}
	var tok [16]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return "", "", err
	}
	cp.Token = hex.EncodeToString(tok[:])
	// token,user,uid,"group,group"
	tokenFile = filepath.Join(cp.Dir, "tokens.csv")
	line := cp.Token + ",admin,admin,system:masters\n"
	if err := os.WriteFile(tokenFile, []byte(line), 0o600); err != nil {
		return "", "", err
	}
	return keyFile, tokenFile, nil
}

// waitEtcd polls etcd's /health.
func (cp *ControlPlane) waitEtcd(ctx context.Context, p *process) error {
	client := &http.Client{Timeout: 2 * time.Second}
	return cp.poll(ctx, p, func() (bool, string) {
		resp, err := client.Get(cp.EtcdURL + "/health")
		if err != nil {
			return false, err.Error()
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"health":"true"`),
			fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	})
}

// waitAPIServer polls kube-apiserver's /readyz, as the admin, once its
// self-signed certificate exists.
func (cp *ControlPlane) waitAPIServer(ctx context.Context, p *process) error {
	var client *http.Client
	defer func() {
		if client != nil {
			client.CloseIdleConnections()
		}
	}()
	return cp.poll(ctx, p, func() (bool, string) {
		if client == nil {
			ca, err := os.ReadFile(cp.CAFile)
			pool := x509.NewCertPool()
			if err != nil || !pool.AppendCertsFromPEM(ca) {
				return false, "no serving certificate yet in " + cp.CAFile
			}
			if cp.caData == nil { // first start; a restart reuses the certificate
				cp.caData = ca
			}
			client = &http.Client{
				Timeout:   2 * time.Second,
				Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
			}
		}
		req, _ := http.NewRequest(http.MethodGet, cp.URL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+cp.Token)
		resp, err := client.Do(req)
		if err != nil {
			return false, err.Error()
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<10))
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	})
}

// poll calls ready every 100 ms until it says true, the process exits,
// ReadyTimeout passes or ctx ends. The error carries the last answer and
// the tail of the process's log.
func (cp *ControlPlane) poll(ctx context.Context, p *process, ready func() (bool, string)) error {
	ctx, cancel := context.WithTimeout(ctx, cp.opts.ReadyTimeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last := "no answer yet"
	for {
		ok, why := ready()
		if ok {
			return nil
		}
		last = why
		select {
		case <-p.exited:
			err := p.exitError()
			log := p.tail(40)
			if strings.Contains(log, "address already in use") {
				err = fmt.Errorf("%w (%w)", err, errPortTaken)
			}
			return fmt.Errorf("%w; log tail (%s):\n%s", err, p.logPath, log)
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %v (last answer: %s): %w; log tail (%s):\n%s",
				p.name, cp.opts.ReadyTimeout, last, ctx.Err(), p.logPath, p.tail(40))
		case <-tick.C:
		}
	}
}

// dirPrefix starts the name of each control plane's directory, followed by
// the owner's PID.
const dirPrefix = "steelyard-controlplane-"

// removeOrphanDirs removes the directories of owners that have died without
// cleaning up (a test binary killed by `go test -timeout` or SIGKILL). Their
// processes died with them (Pdeathsig).
func removeOrphanDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*-*"))
	for _, d := range dirs {
		pid, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(filepath.Base(d), dirPrefix), "-", 2)[0])
		if err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(d)
		}
	}
}

// freePorts returns n distinct loopback ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
