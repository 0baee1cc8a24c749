package shell

import (
	"path"
	"strings"
)

// hasGlobMeta reports whether s has an unescaped glob metacharacter.
func hasGlobMeta(s string) bool {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '*', '?', '[':
			return true
		}
	}
	return false
}

// The intersection test below answers "can some path match both patterns?" for a shell glob in a command
// line (cat *.pem) and a denied glob (**/*.pem). It builds a small automaton for each pattern and searches
// their product. Where the answer needs more than a character comparison (two bracket classes), it says
// yes: the caller then asks a person instead of allowing, which is the safe side.

type charCond struct {
	kind  int // condLit, condNoSlash, condAny, condClass
	c     byte
	class string // the bracket expression, for condClass
	noDot bool   // a wildcard at the start of a shell glob's segment: it never matches a leading "."
}

const (
	condLit     = iota
	condNoSlash // any byte but '/'
	condAny     // any byte
	condClass   // a byte the bracket expression matches
	condCont    // a UTF-8 continuation byte (0x80-0xBF)
)

type nfaEdge struct {
	cond charCond
	to   int
}

type nfa struct {
	edges  [][]nfaEdge
	eps    [][]int
	accept int
	shell  bool // built from a shell glob: wildcards skip leading dots
	flat   bool // "*" and "?" match "/" too (git pathspecs)
}

func (n *nfa) newState() int {
	n.edges = append(n.edges, nil)
	n.eps = append(n.eps, nil)
	return len(n.edges) - 1
}

// buildNFAFrom adds states for the absolute pattern segments, each introduced by "/", starting at cur,
// and returns the accepting state.
func buildNFAFrom(n *nfa, cur int, segments []string) int {
	var folded []string
	for _, s := range segments {
		if s == "**" && len(folded) > 0 && folded[len(folded)-1] == "**" {
			continue
		}
		folded = append(folded, s)
	}
	for i := 0; i < len(folded); i++ {
		seg := folded[i]
		if seg != "**" {
			next := n.newState()
			n.edges[cur] = append(n.edges[cur], nfaEdge{charCond{kind: condLit, c: '/'}, next})
			cur = n.segmentChars(next, seg)
			continue
		}
		if i == len(folded)-1 {
			// "/**" at the end: the directory itself, or "/" and anything below it.
			below := n.newState()
			end := n.newState()
			n.edges[cur] = append(n.edges[cur], nfaEdge{charCond{kind: condLit, c: '/'}, below})
			n.edges[below] = append(n.edges[below], nfaEdge{charCond{kind: condAny}, below})
			n.eps[below] = append(n.eps[below], end)
			n.eps[cur] = append(n.eps[cur], end)
			return end
		}
		// "/**/next": "/", then zero or more segments each ending in "/", then the next segment.
		slash := n.newState()
		loop := n.newState()
		after := n.newState()
		n.edges[cur] = append(n.edges[cur], nfaEdge{charCond{kind: condLit, c: '/'}, slash})
		n.eps[slash] = append(n.eps[slash], loop, after)
		n.edges[loop] = append(n.edges[loop], nfaEdge{charCond{kind: condAny}, loop})
		n.edges[loop] = append(n.edges[loop], nfaEdge{charCond{kind: condLit, c: '/'}, after})
		cur = n.segmentChars(after, folded[i+1])
		i++
	}
	return cur
}

// segmentChars adds the characters of one segment pattern and returns the end state. With shell set, a
// wildcard at the start of the segment does not match a leading "." (bash without dotglob).
func (n *nfa) segmentChars(cur int, seg string) int {
	wild := condNoSlash
	if n.flat {
		wild = condAny
	}
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		noDot := n.shell && i == 0
		switch c {
		case '*':
			if noDot {
				exit := n.newState()
				loop := n.newState()
				n.eps[cur] = append(n.eps[cur], exit)
				n.edges[cur] = append(n.edges[cur], nfaEdge{charCond{kind: condNoSlash, noDot: true}, loop})
				n.edges[loop] = append(n.edges[loop], nfaEdge{charCond{kind: condNoSlash}, loop})
				n.eps[loop] = append(n.eps[loop], exit)
				cur = exit
				continue
			}
			loop := n.newState()
			n.eps[cur] = append(n.eps[cur], loop)
			n.edges[loop] = append(n.edges[loop], nfaEdge{charCond{kind: wild}, loop})
			cur = loop
			continue
		case '?':
			cur = n.runeEdge(cur, charCond{kind: wild, noDot: noDot})
			continue
		case '[':
			end := classEnd(seg, i)
			if end > 0 {
				cur = n.runeEdge(cur, charCond{kind: condClass, class: seg[i : end+1], noDot: noDot})
				i = end
				continue
			}
		case '\\':
			if i+1 < len(seg) {
				i++
				c = seg[i]
			}
		}
		next := n.newState()
		n.edges[cur] = append(n.edges[cur], nfaEdge{charCond{kind: condLit, c: c}, next})
		cur = next
	}
	return cur
}

// runeEdge adds a one-character wildcard. The automaton reads bytes and a character may be several
// (UTF-8), so it matches one byte satisfying cond and then any UTF-8 continuation bytes.
func (n *nfa) runeEdge(cur int, cond charCond) int {
	first := n.newState()
	n.edges[cur] = append(n.edges[cur], nfaEdge{cond, first})
	n.edges[first] = append(n.edges[first], nfaEdge{charCond{kind: condCont}, first})
	exit := n.newState()
	n.eps[first] = append(n.eps[first], exit)
	return exit
}

// classEnd returns the index of the "]" closing the bracket expression that starts at seg[i], or -1.
func classEnd(seg string, i int) int {
	j := i + 1
	if j < len(seg) && (seg[j] == '^' || seg[j] == '!') {
		j++
	}
	if j < len(seg) && seg[j] == ']' {
		j++
	}
	for ; j < len(seg); j++ {
		switch seg[j] {
		case '\\':
			j++
		case ']':
			return j
		}
	}
	return -1
}

func condsMeet(a, b charCond) bool {
	if a.kind != condLit && b.kind == condLit {
		a, b = b, a
	}
	if a.kind == condLit && a.c == '.' && b.noDot {
		return false
	}
	if a.kind == condLit {
		switch b.kind {
		case condLit:
			return a.c == b.c
		case condNoSlash:
			return a.c != '/'
		case condAny:
			return true
		case condCont:
			return a.c >= 0x80 && a.c <= 0xBF
		default:
			if a.c == '/' {
				return false
			}
			if a.c >= 0x80 {
				return true // part of a multi-byte character: the class may match it
			}
			cls := strings.Replace(b.class, "[!", "[^", 1)
			ok, err := path.Match(cls, string([]byte{a.c}))
			return ok || err != nil
		}
	}
	return true // two wildcards or classes: assume they can meet
}

// globsIntersect reports whether some path may match both a shell glob from a command line and a denied
// glob (both absolute, given as segments). Denied globs match names in any case (deniedpath), so the two
// meet when they do in lower case. It errs on the side of true.
func globsIntersect(shellGlob, denied []string) bool {
	return intersect(buildSimpleNFA(lowerSegments(shellGlob), true, false), buildSimpleNFA(lowerSegments(denied), false, false))
}

// globsMayMeet is globsIntersect for a shell glob that shell options may widen: dotglob lets a wildcard
// match a leading dot, nocaseglob ignores case.
func globsMayMeet(shellGlob, denied []string) bool {
	return intersect(buildSimpleNFA(lowerSegments(shellGlob), false, false), buildSimpleNFA(lowerSegments(denied), false, false))
}

// pathspecMayMeet is globsMayMeet for a git pathspec, whose "*" and "?" also match "/".
func pathspecMayMeet(pathspec, denied []string) bool {
	return intersect(buildSimpleNFA(lowerSegments(pathspec), false, true), buildSimpleNFA(lowerSegments(denied), false, false))
}

func lowerSegments(segs []string) []string {
	out := make([]string, len(segs))
	for i, s := range segs {
		out[i] = strings.ToLower(s)
	}
	return out
}

func intersect(na, nb *nfa) bool {
	type pair struct{ x, y int }
	seen := map[pair]bool{}
	var stack []pair
	push := func(x, y int) {
		for _, cx := range na.closure(x) {
			for _, cy := range nb.closure(y) {
				p := pair{cx, cy}
				if !seen[p] {
					seen[p] = true
					stack = append(stack, p)
				}
			}
		}
	}
	push(0, 0)
	for len(stack) > 0 {
		p := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if p.x == na.accept && p.y == nb.accept {
			return true
		}
		for _, ea := range na.edges[p.x] {
			for _, eb := range nb.edges[p.y] {
				if condsMeet(ea.cond, eb.cond) {
					push(ea.to, eb.to)
				}
			}
		}
	}
	return false
}

func (n *nfa) closure(s int) []int {
	out := []int{s}
	seen := map[int]bool{s: true}
	for i := 0; i < len(out); i++ {
		for _, t := range n.eps[out[i]] {
			if !seen[t] {
				seen[t] = true
				out = append(out, t)
			}
		}
	}
	return out
}

// buildSimpleNFA compiles absolute pattern segments into an automaton over the whole path string. With
// shell set, wildcards do not match a leading dot; with flat set, "*" and "?" also match "/".
func buildSimpleNFA(segments []string, shell, flat bool) *nfa {
	n := &nfa{shell: shell, flat: flat}
	start := n.newState()
	n.accept = buildNFAFrom(n, start, segments)
	return n
}
