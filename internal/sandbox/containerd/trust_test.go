package containerd

import (
	"strings"
	"testing"
)

func TestCheckCertificatesOnly(t *testing.T) {
	cert := "-----BEGIN CERTIFICATE-----\nMAoGCCqGSM49BAMC\n-----END CERTIFICATE-----\n"
	key := "-----BEGIN EC PRIVATE KEY-----\nMAoGCCqGSM49BAMC\n-----END EC PRIVATE KEY-----\n"
	for _, tc := range []struct {
		name, pem, want string // want: "" when accepted, else a fragment of the error
	}{
		{"certificates", cert + cert, ""},
		{"a private key among them", cert + key, `type "EC PRIVATE KEY"`},
		{"trailing garbage", cert + "not pem", "trailing data"},
		{"nothing", "", "no PEM certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkCertificatesOnly([]byte(tc.pem))
			if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("checkCertificatesOnly = %v, want %q", err, tc.want)
			}
		})
	}
}
