package call

import "testing"

func TestPullProgressString(t *testing.T) {
	for _, tt := range []struct {
		p    PullProgress
		want string
	}{
		{PullProgress{Image: "r/x:1", Phase: "fetching"}, "pulling image r/x:1"},
		{PullProgress{Image: "r/x:1", BytesDone: 4378624, BytesTotal: 5740665, Phase: "fetching"}, "pulling image r/x:1: 4.4 MB of 5.7 MB (76%)"},
		{PullProgress{Image: "r/x:1", BytesDone: 5740665, BytesTotal: 5740665, Phase: "unpacking"}, "unpacking image r/x:1: 5.7 MB"},
		{PullProgress{Image: "r/x:1", BytesDone: 5740665, BytesTotal: 5740665, Phase: "done"}, "pulled image r/x:1: 5.7 MB"},
	} {
		if got := tt.p.String(); got != tt.want {
			t.Errorf("%+v: %q, want %q", tt.p, got, tt.want)
		}
	}
}
