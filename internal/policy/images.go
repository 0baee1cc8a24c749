package policy

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/distribution/reference"
)

// fileImages is an images section of a layer or of a tool: which OCI images a call may ask for.
type fileImages struct {
	// Allow lists the images a call may ask for, each a registry host ("registry.example.com"), a
	// repository prefix ending in "/" ("ghcr.io/acme/") or one repository ("docker.io/library/python").
	Allow []string `yaml:"allow"`
	// DigestsOnly admits only references by digest (repository@sha256:...), never a tag that can move.
	DigestsOnly bool `yaml:"digests_only"`
}

// imageRule is a validated images section.
type imageRule struct {
	field       string // where it is written: "images" or "tools.run_shell.images"
	allow       []imagePattern
	digestsOnly bool
}

// imagePattern is one allow entry: a registry host, a repository prefix or a repository.
type imagePattern struct {
	source string
	host   string // set for a registry pattern
	prefix string // set for a repository prefix (ends in "/")
	repo   string // set for one repository
}

func (p imagePattern) matches(named reference.Named) bool {
	switch {
	case p.host != "":
		return reference.Domain(named) == p.host
	case p.prefix != "":
		return strings.HasPrefix(named.Name(), p.prefix)
	}
	return named.Name() == p.repo
}

// images validates an images section found at at.
func (v *validator) images(at []string, f *fileImages) (*imageRule, error) {
	if f == nil {
		return nil, nil
	}
	r := &imageRule{field: dottedField(at), digestsOnly: f.DigestsOnly, allow: []imagePattern{}}
	for i, s := range f.Allow {
		p, err := parseImagePattern(s)
		if err != nil {
			return nil, v.errf(join(at, "allow", strconv.Itoa(i)), "%w", err)
		}
		r.allow = append(r.allow, p)
	}
	return r, nil
}

func parseImagePattern(s string) (imagePattern, error) {
	hint := `write a registry host ("registry.example.com"), a repository prefix ending in "/" ("ghcr.io/acme/") or a repository ("docker.io/library/python")`
	switch {
	case s == "":
		return imagePattern{}, errors.New("an empty image pattern: " + hint)
	case !strings.Contains(s, "/"):
		if strings.ContainsAny(s, "@ ") || strings.ToLower(s) != s {
			return imagePattern{}, fmt.Errorf("image pattern %q is not a registry host: %s", s, hint)
		}
		return imagePattern{source: s, host: s}, nil
	case strings.HasSuffix(s, "/"):
		named, err := reference.ParseNormalizedNamed(strings.TrimSuffix(s, "/"))
		if err != nil || !reference.IsNameOnly(named) {
			return imagePattern{}, fmt.Errorf("image pattern %q is not a repository prefix: %s", s, hint)
		}
		return imagePattern{source: s, prefix: named.Name() + "/"}, nil
	}
	named, err := reference.ParseNormalizedNamed(s)
	if err != nil || !reference.IsNameOnly(named) {
		return imagePattern{}, fmt.Errorf("image pattern %q is not a repository (no tag or digest): %s", s, hint)
	}
	return imagePattern{source: s, repo: named.Name()}, nil
}

// ImageVerdict is policy's answer to a call asking for an image.
type ImageVerdict struct {
	// Allowed reports that every layer admits the image.
	Allowed bool
	// Rule names the section that refused it ("tenant acme's policy: images"), Reason says why in words,
	// and Patterns are the images that section allows, as written.
	Rule     string
	Reason   string
	Patterns []string
}

// ErrImageReference marks a reference that does not parse.
var ErrImageReference = errors.New("image reference does not parse")

// CheckImage decides whether tenant's call of tool may run on image ref. Every layer (the operator's, the
// tenant's) that has an images section must admit it, a tool's section replacing its layer's; with no
// section in any layer, no image may be asked for. It returns ErrImageReference, wrapped with what to
// write, when ref does not parse.
func (p *Policy) CheckImage(tenant, tool, ref string) (ImageVerdict, error) {
	named, err := parseImageRef(ref)
	if err != nil {
		return ImageVerdict{}, err
	}
	_, byDigest := named.(reference.Digested)
	seen := false
	for _, l := range p.layersFor(tenant) {
		r := l.images
		if t := l.tools[tool]; t != nil && t.images != nil {
			r = t.images
		}
		if r == nil {
			continue
		}
		seen = true
		rule := l.origin + ": " + r.field
		var patterns []string
		matched := false
		for _, pat := range r.allow {
			patterns = append(patterns, pat.source)
			matched = matched || pat.matches(named)
		}
		switch {
		case !matched:
			return ImageVerdict{Rule: rule, Patterns: patterns, Reason: fmt.Sprintf("image %s is not among the images %s allows (%s): ask for one of those, or have the operator add it",
				named, rule, listOrNone(patterns))}, nil
		case r.digestsOnly && !byDigest:
			return ImageVerdict{Rule: rule, Patterns: patterns, Reason: fmt.Sprintf("%s allows images by digest only: write %s@sha256:<digest> instead of a tag",
				rule, named.Name())}, nil
		}
	}
	if !seen {
		return ImageVerdict{Rule: "images", Reason: "policy allows no images: calls run on the default image or the host view, " +
			"unless the operator lists allowed images under images.allow in the policy"}, nil
	}
	return ImageVerdict{Allowed: true}, nil
}

// ParseImageRef returns the full name of image reference ref (docker.io and :latest filled in as Docker
// does), or an error wrapping ErrImageReference that says how to write one.
func ParseImageRef(ref string) (string, error) {
	named, err := parseImageRef(ref)
	if err != nil {
		return "", err
	}
	return named.String(), nil
}

func parseImageRef(ref string) (reference.Named, error) {
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return nil, fmt.Errorf("%w: %q (%v): write registry/repository:tag or registry/repository@sha256:<64 hex digits>", ErrImageReference, ref, err)
	}
	return named, nil
}

func listOrNone(patterns []string) string {
	if len(patterns) == 0 {
		return "none"
	}
	return strings.Join(patterns, ", ")
}
