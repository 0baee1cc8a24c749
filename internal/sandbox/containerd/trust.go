package containerd

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Where a container with Spec.TrustedCAs finds them.
const (
	// caBundlePath is the system's roots plus the extra certificates.
	caBundlePath = toolpoolDir + "/ca-certificates.crt"
	// caExtraPath is the extra certificates alone (NODE_EXTRA_CA_CERTS adds to Node's own roots).
	caExtraPath = toolpoolDir + "/extra-ca.pem"
	// hostCABundle is Debian's system bundle, the default of OpenSSL, GnuTLS and Go; on the host-view root
	// the bundle is mounted over it too, for programs that read no variable.
	hostCABundle = "/etc/ssl/certs/ca-certificates.crt"
)

// trustMounts returns the mounts and environment that make a container trust the PEM certificates of
// extra on top of the system's roots. The bundles are written once per distinct extra under the state
// dir (read-only to the container, like every extra mount). hostRoot says the container runs on the
// host-view root, whose /etc/ssl/certs is the host's.
func (r *Runtime) trustMounts(extra []byte, hostRoot bool) ([]specs.Mount, []string, error) {
	if err := checkCertificatesOnly(extra); err != nil {
		return nil, nil, err
	}
	sum := sha256.Sum256(extra)
	name := hex.EncodeToString(sum[:16])
	dir := filepath.Join(r.cfg.StateDir, "ca")
	bundle, extraFile := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".extra.pem")
	r.trustMu.Lock()
	if !r.trustWritten[name] {
		system, err := os.ReadFile(hostCABundle)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			r.trustMu.Unlock()
			return nil, nil, fmt.Errorf("read system CA bundle: %w", err)
		}
		all := append(append(bytes.TrimRight(system, "\n"), '\n'), extra...)
		if err = os.MkdirAll(dir, 0o755); err == nil {
			if err = writeFileAtomic(bundle, all); err == nil {
				err = writeFileAtomic(extraFile, extra)
			}
		}
		if err != nil {
			r.trustMu.Unlock()
			return nil, nil, fmt.Errorf("write CA bundle: %w", err)
		}
		r.trustWritten[name] = true
	}
	r.trustMu.Unlock()
	mounts := []specs.Mount{roBind(bundle, caBundlePath), roBind(extraFile, caExtraPath)}
	hasCerts := slices.ContainsFunc(r.rootfs.mounts, func(m specs.Mount) bool { return m.Destination == "/etc/ssl/certs" })
	if _, err := os.Stat(hostCABundle); hostRoot && hasCerts && err == nil {
		mounts = append(mounts, roBind(bundle, hostCABundle))
	}
	env := []string{"NODE_EXTRA_CA_CERTS=" + caExtraPath}
	for _, v := range []string{"SSL_CERT_FILE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "REQUESTS_CA_BUNDLE", "PIP_CERT"} {
		env = append(env, v+"="+caBundlePath)
	}
	return mounts, env, nil
}

// checkCertificatesOnly refuses PEM data that holds anything but certificates (a private key above all).
func checkCertificatesOnly(data []byte) error {
	n := 0
	for rest := data; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			if len(bytes.TrimSpace(rest)) > 0 {
				return errors.New("trusted CAs: trailing data that is not PEM")
			}
			break
		}
		if block.Type != "CERTIFICATE" {
			return fmt.Errorf("trusted CAs: a PEM block of type %q: only certificates may enter a container", block.Type)
		}
		n++
	}
	if n == 0 {
		return errors.New("trusted CAs: no PEM certificate")
	}
	return nil
}

func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
