package containerd_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// TestTrustedCAs: a container with Spec.TrustedCAs sees them at the end of the system bundle it reads by
// default and through the usual variables; a container without them sees the host's bundle untouched; a
// key is never let in.
func TestTrustedCAs(t *testing.T) {
	rt, _ := ctrtest.NewRuntime(t, containerd.Config{})
	ws := workspace(t)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "trust test CA"}, IsCA: true,
		BasicConstraintsValid: true, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	certLine := strings.Split(strings.TrimSpace(string(ca)), "\n")[1] // a line of the certificate

	check := `tail -c 2000 /etc/ssl/certs/ca-certificates.crt; echo "SSL_CERT_FILE=$SSL_CERT_FILE NODE=$NODE_EXTRA_CA_CERTS GIT=$GIT_SSL_CAINFO PIP=$PIP_CERT"; ` +
		`grep -c BEGIN "$NODE_EXTRA_CA_CERTS"; test "$(wc -l < /.toolpool/ca-certificates.crt)" -gt 100 && echo bundle-has-system-roots`
	spec := shell(ws, check, 20*time.Second)
	spec.TrustedCAs = ca
	out, err := rt.Run(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	stdout := out.Stdout.String()
	for _, want := range []string{certLine, "SSL_CERT_FILE=/.toolpool/ca-certificates.crt NODE=/.toolpool/extra-ca.pem GIT=/.toolpool/ca-certificates.crt PIP=/.toolpool/ca-certificates.crt",
		"\n1\n", "bundle-has-system-roots"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s\n%s", want, stdout, out.Stderr.String())
		}
	}

	plain, err := rt.Run(context.Background(), shell(ws, `grep -c "`+certLine+`" /etc/ssl/certs/ca-certificates.crt; echo "SSL_CERT_FILE=$SSL_CERT_FILE"`, 20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if got := plain.Stdout.String(); got != "0\nSSL_CERT_FILE=\n" {
		t.Errorf("a container without trusted CAs saw %q", got)
	}

	withKey := shell(ws, "true", 20*time.Second)
	withKey.TrustedCAs = append(ca, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: []byte{1}})...)
	if _, err := rt.Run(context.Background(), withKey); !errors.Is(err, sandbox.ErrNotStarted) || !strings.Contains(err.Error(), "only certificates") {
		t.Errorf("Run with a key = %v, want a refusal before start", err)
	}
}
