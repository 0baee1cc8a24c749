package shell

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Decoders for the escapes shells and their builtins interpret, so that policy judges the text that
// runs: $'...' quoting, echo's escapes (dash's echo and echo -e) and printf's format.

// decodeANSIC decodes the body of bash's $'...' quoting. Like bash, it stops at a NUL byte: the value is
// a C string.
func decodeANSIC(s string) string {
	if !strings.Contains(s, `\`) {
		s, _, _ = strings.Cut(s, "\x00")
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		i++
		c := s[i]
		switch c {
		case 'a':
			b.WriteByte('\a')
		case 'b':
			b.WriteByte('\b')
		case 'e', 'E':
			b.WriteByte(0x1b)
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'v':
			b.WriteByte('\v')
		case '\\', '\'', '"', '?':
			b.WriteByte(c)
		case 'c':
			if i+1 < len(s) {
				i++
				b.WriteByte(s[i] & 0x1f)
			} else {
				b.WriteString(`\c`)
			}
		case 'x':
			n, used := hexDigits(s[i+1:], 2)
			if used == 0 {
				b.WriteString(`\x`)
				continue
			}
			b.WriteByte(byte(n))
			i += used
		case 'u', 'U':
			width := 4
			if c == 'U' {
				width = 8
			}
			n, used := hexDigits(s[i+1:], width)
			if used == 0 {
				b.WriteByte('\\')
				b.WriteByte(c)
				continue
			}
			b.WriteRune(rune(n))
			i += used
		case '0', '1', '2', '3', '4', '5', '6', '7':
			n, used := octDigits(s[i:], 3)
			b.WriteByte(byte(n))
			i += used - 1
		default:
			b.WriteByte('\\')
			b.WriteByte(c)
		}
	}
	out := b.String()
	if k := strings.IndexByte(out, 0); k >= 0 {
		out = out[:k]
	}
	return out
}

// decodeEcho decodes the escapes of bash's echo -e, which include dash's echo's: \0nnn is octal, \c
// ends the output. stopped reports a \c.
func decodeEcho(s string) (out string, stopped bool) {
	if !strings.Contains(s, `\`) {
		return s, false
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		c := s[i+1]
		switch c {
		case '0':
			n, used := octDigits(s[i+2:], 3)
			b.WriteByte(byte(n))
			i += 1 + used
		case 'c':
			return b.String(), true
		case 'x', 'u', 'U', 'a', 'b', 'e', 'E', 'f', 'n', 'r', 't', 'v', '\\':
			// The same as in $'...', one escape at a time.
			k := escapeEnd(s, i)
			b.WriteString(decodeANSIC(s[i:k]))
			i = k - 1
		default:
			b.WriteByte('\\')
		}
	}
	return b.String(), false
}

// printfOutput computes what printf FORMAT ARGS... writes when the format uses only escapes and the
// directives %%, %s, %b and %c. ok is false for anything else.
func printfOutput(args []string) (string, bool) {
	if len(args) == 0 {
		return "", false
	}
	format, rest := args[0], args[1:]
	var b strings.Builder
	for round := 0; round < 64; round++ {
		consumed := false
		for i := 0; i < len(format); i++ {
			c := format[i]
			switch {
			case c == '\\' && i+1 < len(format):
				switch format[i+1] {
				case '0', '1', '2', '3', '4', '5', '6', '7':
					n, used := octDigits(format[i+1:], 3)
					b.WriteByte(byte(n))
					i += used
					continue
				case 'c':
					return b.String(), true
				}
				k := escapeEnd(format, i)
				b.WriteString(decodeANSIC(format[i:k]))
				i = k - 1
			case c == '%' && i+1 < len(format):
				i++
				var arg string
				if format[i] != '%' {
					consumed = true
					if len(rest) > 0 {
						arg, rest = rest[0], rest[1:]
					}
				}
				switch format[i] {
				case '%':
					b.WriteByte('%')
				case 's':
					b.WriteString(arg)
				case 'b':
					d, stop := decodeEcho(arg)
					b.WriteString(d)
					if stop {
						return b.String(), true
					}
				case 'c':
					if arg != "" {
						_, size := utf8.DecodeRuneInString(arg)
						b.WriteString(arg[:size])
					}
				default:
					return "", false
				}
			default:
				b.WriteByte(c)
			}
		}
		if !consumed || len(rest) == 0 {
			return b.String(), true
		}
	}
	return "", false
}

// escapeEnd returns where the escape that starts with the backslash at s[i] ends: after \x and up to 2
// hex digits, \u and up to 4, \U and up to 8, or after one letter.
func escapeEnd(s string, i int) int {
	k := i + 2
	if k > len(s) {
		return len(s)
	}
	width := map[byte]int{'x': 2, 'u': 4, 'U': 8}[s[i+1]]
	_, used := hexDigits(s[k:], width)
	return k + used
}

func hexDigits(s string, max int) (n uint64, used int) {
	for used < max && used < len(s) && strings.IndexByte("0123456789abcdefABCDEF", s[used]) >= 0 {
		used++
	}
	if used == 0 {
		return 0, 0
	}
	n, _ = strconv.ParseUint(s[:used], 16, 64)
	return n, used
}

func octDigits(s string, max int) (n uint64, used int) {
	for used < max && used < len(s) && s[used] >= '0' && s[used] <= '7' {
		used++
	}
	if used == 0 {
		return 0, 0
	}
	n, _ = strconv.ParseUint(s[:used], 8, 64)
	return n, used
}
