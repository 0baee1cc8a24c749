package dispatcher

import "testing"

func TestParseRange(t *testing.T) {
	for _, tc := range []struct {
		header      string
		off, length int64
		ok          bool
	}{
		{"bytes=0-9", 0, 10, true},
		{"bytes=7-20", 7, 14, true},
		{"bytes=5-", 5, -1, true},
		{"bytes=-5", -5, -1, true},
		{"bytes=9-3", 0, 0, false},
		{"bytes=-0", 0, 0, false},
		{"bytes=0-1,4-5", 0, 0, false},
		{"items=0-1", 0, 0, false},
		{"bytes=a-b", 0, 0, false},
		{"bytes=-", 0, 0, false},
		{"bytes=-1-2", 0, 0, false},
	} {
		off, length, ok := parseRange(tc.header)
		if ok != tc.ok || (ok && (off != tc.off || length != tc.length)) {
			t.Errorf("parseRange(%q) = %d, %d, %v; want %d, %d, %v", tc.header, off, length, ok, tc.off, tc.length, tc.ok)
		}
	}
}
