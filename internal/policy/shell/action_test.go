package shell

import "testing"

func TestActionStricter(t *testing.T) {
	cases := []struct {
		name string
		a, b Action
		want Action
	}{
		{"allow allow", Allow, Allow, Allow},
		{"allow ask", Allow, Ask, Ask},
		{"ask allow", Ask, Allow, Ask},
		{"ask deny", Ask, Deny, Deny},
		{"deny allow", Deny, Allow, Deny},
		{"deny deny", Deny, Deny, Deny},
		{"unknown counts as deny", Allow, Action("maybe"), Deny},
		{"empty counts as deny", Action(""), Allow, Deny},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.a.Stricter(c.b); got != c.want {
				t.Errorf("%q.Stricter(%q) = %q, want %q", c.a, c.b, got, c.want)
			}
		})
	}
}

func TestActionValid(t *testing.T) {
	for _, c := range []struct {
		a    Action
		want bool
	}{{Allow, true}, {Ask, true}, {Deny, true}, {"", false}, {"ALLOW", false}, {"alow", false}} {
		if got := c.a.Valid(); got != c.want {
			t.Errorf("%q.Valid() = %v, want %v", c.a, got, c.want)
		}
	}
}
