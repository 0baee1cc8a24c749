package dispatcher

import "testing"

func TestParsePosition(t *testing.T) {
	tests := []struct {
		id      string
		want    position
		wantErr bool
	}{
		{"", position{}, false},
		{"0.0", position{}, false},
		{"1024.7", position{1024, 7}, false},
		{"1024", position{}, true},
		{"a.b", position{}, true},
		{"-1.0", position{}, true},
		{"1.2.3", position{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			got, err := parsePosition(tt.id)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("parsePosition(%q) = %v, %v", tt.id, got, err)
			}
			if err == nil && tt.id != "" && got.String() != tt.id {
				t.Errorf("String() = %q, want %q", got.String(), tt.id)
			}
		})
	}
}

func TestOutputEventIsBinarySafe(t *testing.T) {
	if e := newOutputEvent(3, []byte("héllo")); e.Text != "héllo" || e.Base64 != "" || e.Offset != 3 {
		t.Errorf("text: %+v", e)
	}
	if e := newOutputEvent(0, []byte{0xff, 'a'}); e.Text != "" || e.Base64 != "/2E=" {
		t.Errorf("binary: %+v", e)
	}
}
