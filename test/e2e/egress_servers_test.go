package e2e

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/cgi"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// The servers the egress tests reach from inside containers. There is no outside network here, so every
// name below resolves, through the test's own DNS server, to 127.0.0.2, which the worker's egress config
// (test.public_addrs) treats as public; 127.0.0.1 stays what it is, loopback, and is always refused.
const (
	publicTestAddr = "127.0.0.2"
	// corpSuffix marks the hosts that need a credential, which the worker's proxy injects:
	// git.corp.test, files.corp.test, ...
	corpSuffix = ".corp.test"
)

// testPKI is a test CA and a server certificate it signed for every test name.
type testPKI struct {
	caPEM  []byte
	server tls.Certificate
}

func newTestPKI(t testing.TB, names ...string) *testPKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "e2e test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, caKey.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ = x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, leaf, ca, key.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	return &testPKI{caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		server: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}}
}

// dnsServer answers A queries from a function of the name and how many A queries for it came before;
// AAAA queries get no answer, unknown names NXDOMAIN. It serves UDP on loopback until the test ends.
type dnsServer struct {
	addr    string
	mu      sync.Mutex
	queries map[string]int
}

func startDNS(t testing.TB, answer func(name string, nth int) (netip.Addr, bool)) *dnsServer {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	d := &dnsServer{addr: pc.LocalAddr().String(), queries: map[string]int{}}
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if resp, err := d.respond(buf[:n], answer); err == nil {
				pc.WriteTo(resp, from)
			}
		}
	}()
	return d
}

func (d *dnsServer) respond(req []byte, answer func(string, int) (netip.Addr, bool)) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(req)
	if err != nil {
		return nil, err
	}
	q, err := p.Question()
	if err != nil {
		return nil, err
	}
	name := strings.TrimSuffix(strings.ToLower(q.Name.String()), ".")
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired}
	var addr netip.Addr
	known := false
	if q.Type == dnsmessage.TypeA {
		d.mu.Lock()
		nth := d.queries[name]
		d.queries[name]++
		d.mu.Unlock()
		addr, known = answer(name, nth)
	} else {
		_, known = answer(name, -1) // AAAA and the rest: the name exists, without such records
	}
	if !known {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	if known && q.Type == dnsmessage.TypeA {
		if err := b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET}, dnsmessage.AResource{A: addr.As4()}); err != nil {
			return nil, err
		}
	}
	return b.Finish()
}

// aQueries returns how many A queries name got.
func (d *dnsServer) aQueries(name string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.queries[name]
}

// victim is a TCP listener on loopback that no call may ever reach: it counts the connections it accepts.
type victim struct {
	l        net.Listener
	accepted atomic.Int64
}

func startVictim(t testing.TB, addr string) (*victim, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	v := &victim{l: l}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			v.accepted.Add(1)
			c.Close()
		}
	}()
	return v, nil
}

// origin is the HTTPS server behind every test name, routed by the Host's first label: git (smart HTTP
// through git-http-backend), files, goproxy (a Go module proxy), npm (a registry) and pypi (a simple
// index). A host ending in corpSuffix requires its credential and remembers the Authorization it got.
type origin struct {
	port   int
	creds  map[string]string // corp host -> the Authorization value it requires
	mu     sync.Mutex
	authz  map[string][]string // corp host -> the Authorization values it received
	hosts  map[string]int      // host -> requests it got
	gitDir string
}

// Module, package and file contents the clients must end up with.
const (
	filesBody   = "hello from files.test\n"
	goModule    = "example.test/hello"
	goSource    = "package hello\n\n// Hello greets.\nfunc Hello() string { return \"hello from the module proxy\" }\n"
	npmPackage  = "hello-tp"
	npmIndexJS  = "module.exports = 'hello from the npm registry';\n"
	pyPackage   = "hello-tp"
	pyWheelName = "hello_tp-1.0.0-py3-none-any.whl"
	gitFile     = "hello from the git server\n"
)

// startOrigin serves on publicTestAddr with TLS from pki. victimOnLoopback is made to listen on
// 127.0.0.1 at the same port, for the DNS-rebinding test (a name that first resolves to the origin and
// then to loopback, same port).
func startOrigin(t testing.TB, pki *testPKI, creds map[string]string) (*origin, *victim) {
	t.Helper()
	o := &origin{creds: creds, authz: map[string][]string{}, hosts: map[string]int{}, gitDir: t.TempDir()}
	o.initGit(t)
	var l net.Listener
	var v *victim
	for attempt := 0; ; attempt++ {
		var err error
		l, err = net.Listen("tcp", publicTestAddr+":0")
		if err != nil {
			t.Fatal(err)
		}
		o.port = l.Addr().(*net.TCPAddr).Port
		if v, err = startVictim(t, fmt.Sprintf("127.0.0.1:%d", o.port)); err == nil {
			break
		}
		l.Close()
		if attempt > 20 {
			t.Fatalf("no port free on both %s and 127.0.0.1: %v", publicTestAddr, err)
		}
	}
	srv := &http.Server{Handler: o, TLSConfig: &tls.Config{Certificates: []tls.Certificate{pki.server}}, ReadHeaderTimeout: 10 * time.Second}
	go srv.ServeTLS(l, "", "")
	t.Cleanup(func() { srv.Close() })
	return o, v
}

func (o *origin) initGit(t testing.TB) {
	t.Helper()
	work := filepath.Join(o.gitDir, "work")
	bare := filepath.Join(o.gitDir, "repo.git")
	run := func(dir string, args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		t.Fatal(err)
	}
	run(o.gitDir, "init", "-q", "--bare", "-b", "main", bare)
	run(work, "init", "-q", "-b", "main")
	if err := os.WriteFile(filepath.Join(work, "README"), []byte(gitFile), 0o644); err != nil {
		t.Fatal(err)
	}
	run(work, "add", "README")
	run(work, "commit", "-q", "-m", "first")
	run(work, "push", "-q", bare, "main")
}

// requests returns how many requests host got.
func (o *origin) requests(host string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.hosts[host]
}

// seen returns the Authorization values host received.
func (o *origin) seen(host string) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.authz[host]...)
}

func (o *origin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	host, _, err := net.SplitHostPort(r.Host)
	if err != nil {
		host = r.Host
	}
	o.mu.Lock()
	o.hosts[host]++
	o.mu.Unlock()
	if strings.HasSuffix(host, corpSuffix) {
		got := r.Header.Get("Authorization")
		o.mu.Lock()
		o.authz[host] = append(o.authz[host], got)
		o.mu.Unlock()
		if want, ok := o.creds[host]; !ok || got != want {
			w.Header().Set("WWW-Authenticate", `Basic realm="corp"`)
			http.Error(w, "401: this host needs its credential", http.StatusUnauthorized)
			return
		}
	}
	base := "https://" + r.Host
	switch strings.SplitN(host, ".", 2)[0] {
	case "git":
		(&cgi.Handler{Path: "/usr/lib/git-core/git-http-backend",
			Env: []string{"GIT_PROJECT_ROOT=" + o.gitDir, "GIT_HTTP_EXPORT_ALL=1"}}).ServeHTTP(w, r)
	case "files":
		switch r.URL.Path {
		case "/hello.txt":
			w.Write([]byte(filesBody))
		case "/redirect":
			http.Redirect(w, r, r.URL.Query().Get("to"), http.StatusFound)
		default:
			http.NotFound(w, r)
		}
	case "rebind":
		w.Write([]byte("served by the public address\n"))
	case "goproxy":
		o.goProxy(w, r)
	case "npm":
		o.npmRegistry(w, r, base)
	case "pypi":
		o.pypiIndex(w, r, base)
	default:
		http.NotFound(w, r)
	}
}

func (o *origin) goProxy(w http.ResponseWriter, r *http.Request) {
	prefix := "/" + goModule + "/@v/"
	rest, ok := strings.CutPrefix(r.URL.Path, prefix)
	if !ok {
		http.NotFound(w, r)
		return
	}
	mod := "module " + goModule + "\n\ngo 1.21\n"
	switch rest {
	case "list":
		w.Write([]byte("v1.0.0\n"))
	case "v1.0.0.info":
		w.Write([]byte(`{"Version":"v1.0.0","Time":"2024-01-02T03:04:05Z"}`))
	case "v1.0.0.mod":
		w.Write([]byte(mod))
	case "v1.0.0.zip":
		w.Write(zipOf(map[string]string{goModule + "@v1.0.0/go.mod": mod, goModule + "@v1.0.0/hello.go": goSource}))
	default:
		http.NotFound(w, r)
	}
}

func (o *origin) npmRegistry(w http.ResponseWriter, r *http.Request, base string) {
	tgz := npmTarball()
	switch r.URL.Path {
	case "/" + npmPackage:
		sha := sha1.Sum(tgz)
		integrity := sha512.Sum512(tgz)
		doc := map[string]any{"name": npmPackage, "dist-tags": map[string]string{"latest": "1.0.0"},
			"versions": map[string]any{"1.0.0": map[string]any{"name": npmPackage, "version": "1.0.0",
				"dist": map[string]string{"tarball": base + "/" + npmPackage + "/-/" + npmPackage + "-1.0.0.tgz",
					"shasum": hex.EncodeToString(sha[:]), "integrity": "sha512-" + base64.StdEncoding.EncodeToString(integrity[:])}}}}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(doc)
	case "/" + npmPackage + "/-/" + npmPackage + "-1.0.0.tgz":
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(tgz)
	default:
		http.NotFound(w, r)
	}
}

func npmTarball() []byte {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, f := range []struct{ name, body string }{
		{"package/package.json", `{"name":"` + npmPackage + `","version":"1.0.0","main":"index.js"}`},
		{"package/index.js", npmIndexJS},
	} {
		tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.body)), ModTime: time.Unix(1700000000, 0)})
		tw.Write([]byte(f.body))
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

func (o *origin) pypiIndex(w http.ResponseWriter, r *http.Request, base string) {
	wheel := zipOf(map[string]string{
		"hello_tp/__init__.py":                   "GREETING = 'hello from the package index'\n",
		"hello_tp-1.0.0.dist-info/METADATA":      "Metadata-Version: 2.1\nName: hello-tp\nVersion: 1.0.0\n",
		"hello_tp-1.0.0.dist-info/WHEEL":         "Wheel-Version: 1.0\nGenerator: e2e\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
		"hello_tp-1.0.0.dist-info/RECORD":        "",
		"hello_tp-1.0.0.dist-info/top_level.txt": "hello_tp\n",
	})
	switch r.URL.Path {
	case "/simple/" + pyPackage + "/":
		sum := sha256.Sum256(wheel)
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<!DOCTYPE html><html><body><a href="%s/files/%s#sha256=%s">%s</a></body></html>`,
			base, pyWheelName, hex.EncodeToString(sum[:]), pyWheelName)
	case "/files/" + pyWheelName:
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(wheel)
	default:
		http.NotFound(w, r)
	}
}

// zipOf returns a zip archive of files (name to content), in a stable order.
func zipOf(files map[string]string) []byte {
	var names []string
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, n := range names {
		f, _ := zw.CreateHeader(&zip.FileHeader{Name: n, Method: zip.Deflate, Modified: time.Unix(1700000000, 0)})
		f.Write([]byte(files[n]))
	}
	zw.Close()
	return buf.Bytes()
}

// requireClients fails the test when a client the egress matrix runs inside containers is missing from
// the host's /usr, which the containers see: scripts/deps.sh installs them (git, curl, python3-pip; Node
// and Go come with the CI image). It never skips: a matrix without a client proves nothing about it.
func requireClients(t testing.TB) {
	t.Helper()
	var missing []string
	for _, c := range []struct{ path, what string }{
		{"/usr/bin/git", "git (apt-get install git)"},
		{"/usr/lib/git-core/git-http-backend", "git-http-backend (apt-get install git)"},
		{"/usr/bin/curl", "curl (apt-get install curl)"},
		{"/usr/bin/python3", "python3 (apt-get install python3-pip)"},
		{"/usr/bin/node", "node (Node 20)"},
		{"/usr/bin/npm", "npm (Node 20)"},
	} {
		if _, err := os.Stat(c.path); err != nil {
			missing = append(missing, c.what)
		}
	}
	if out, err := exec.Command("/usr/bin/python3", "-m", "pip", "--version").CombinedOutput(); err != nil {
		missing = append(missing, fmt.Sprintf("pip for /usr/bin/python3 (apt-get install python3-pip): %v %s", err, bytes.TrimSpace(out)))
	}
	if _, err := goInUsr(); err != nil {
		missing = append(missing, err.Error())
	}
	if len(missing) > 0 {
		t.Fatalf("the egress matrix runs these clients inside containers, from the host's /usr; install them (scripts/deps.sh): %s", strings.Join(missing, "; "))
	}
}

// goInUsr returns the go command under /usr, which containers see.
func goInUsr() (string, error) {
	for _, p := range []string{"/usr/local/go/bin/go", "/usr/bin/go", "/usr/lib/go/bin/go"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("go under /usr (/usr/local/go/bin/go)")
}
