package tools

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/toolpool/toolpool/internal/tools/incontainer"
)

// printer renders the schema library's messages where no better sentence exists.
var printer = message.NewPrinter(language.English)

// draft202012 is the JSON Schema dialect of every tool schema; a schema without "$schema" is read as it.
const draft202012 = "https://json-schema.org/draft/2020-12/schema"

// ArgsError is a call whose tool is unknown or whose arguments fail the tool's schema. The dispatcher
// answers it with 422; its message is written for the model that made the call.
type ArgsError struct {
	Tool string
	// UnknownTool is true when no tool is called Tool; Problems then lists the known tools.
	UnknownTool bool
	// Problems are the violations, one sentence each, sorted.
	Problems []string
}

// Error lists every problem.
func (e *ArgsError) Error() string {
	if e.UnknownTool {
		return strings.Join(e.Problems, "; ")
	}
	if len(e.Problems) == 1 {
		return fmt.Sprintf("invalid arguments for %s: %s", e.Tool, e.Problems[0])
	}
	var b strings.Builder
	fmt.Fprintf(&b, "invalid arguments for %s (%d problems):", e.Tool, len(e.Problems))
	for _, p := range e.Problems {
		b.WriteString("\n- ")
		b.WriteString(p)
	}
	return b.String()
}

// compile compiles t.Schema, which must be an object schema.
func (t *Tool) compile() error {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(t.Schema))
	if err != nil {
		return fmt.Errorf("parse schema: %w", err)
	}
	obj, ok := doc.(map[string]any)
	if !ok {
		return fmt.Errorf("check schema: it must be a JSON object, got %s", jsonKind(doc))
	}
	if typ, _ := obj["type"].(string); typ != "object" {
		return fmt.Errorf("check schema: its \"type\" must be \"object\" (tool arguments are a JSON object)")
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(noLoader{})
	url := "toolpool:///tools/" + t.Name + ".json"
	if err := c.AddResource(url, doc); err != nil {
		return fmt.Errorf("add schema: %w", err)
	}
	sch, err := c.Compile(url)
	if err != nil {
		return fmt.Errorf("compile schema: %w", err)
	}
	bare := make(map[string]any, len(obj))
	for k, v := range obj {
		if k != "$schema" {
			bare[k] = v
		}
	}
	if t.bare, err = json.Marshal(bare); err != nil {
		return fmt.Errorf("encode schema: %w", err)
	}
	t.compiled, t.doc = sch, doc
	return nil
}

// noLoader refuses to fetch remote "$ref"s: a schema must be self-contained.
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("load %s: remote references are not allowed, inline the schema", url)
}

// validateSchema returns every schema violation of args, as sentences for a model.
func (t *Tool) validateSchema(args json.RawMessage) []string {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(incontainer.NormalArgs(args)))
	if err != nil {
		return []string{fmt.Sprintf("arguments are not valid JSON (%v): send a JSON object", err)}
	}
	err = t.compiled.Validate(inst)
	if err == nil {
		return nil
	}
	var verr *jsonschema.ValidationError
	if !errors.As(err, &verr) {
		return []string{fmt.Sprintf("arguments could not be validated: %v", err)}
	}
	m := messenger{schema: t.doc, inst: inst, tool: t.Name}
	m.walk(verr)
	sort.Strings(m.out)
	return slices.Compact(m.out)
}

// messenger turns a jsonschema error tree into sentences.
type messenger struct {
	schema any
	inst   any
	tool   string
	out    []string
}

func (m *messenger) walk(e *jsonschema.ValidationError) {
	if k, ok := e.ErrorKind.(*kind.PropertyNames); ok {
		m.out = append(m.out, m.propertyName(e, k.Property))
		return
	}
	if len(e.Causes) > 0 {
		for _, c := range e.Causes {
			m.walk(c)
		}
		return
	}
	m.out = append(m.out, m.leaf(e)...)
}

func (m *messenger) leaf(e *jsonschema.ValidationError) []string {
	loc := e.InstanceLocation
	switch k := e.ErrorKind.(type) {
	case *kind.Required:
		var out []string
		for _, name := range k.Missing {
			out = append(out, fmt.Sprintf("argument %q is required", argName(append(slices.Clone(loc), name))))
		}
		return out
	case *kind.AdditionalProperties:
		allowed := "it takes no arguments"
		if names := propertyNames(schemaAt(m.schema, loc)); len(names) > 0 {
			allowed = "the arguments are " + strings.Join(names, ", ")
		}
		var out []string
		for _, name := range k.Properties {
			out = append(out, fmt.Sprintf("unknown argument %q: %s", argName(append(slices.Clone(loc), name)), allowed))
		}
		return out
	case *kind.Type, *kind.Enum, *kind.Const, *kind.Minimum, *kind.Maximum, *kind.ExclusiveMinimum,
		*kind.ExclusiveMaximum, *kind.MultipleOf, *kind.MinLength, *kind.MaxLength, *kind.Pattern,
		*kind.Format, *kind.MinItems, *kind.MaxItems, *kind.MinProperties, *kind.MaxProperties:
		val, _ := valueAt(m.inst, loc)
		want := describe(schemaAt(m.schema, loc))
		if want == "" {
			want = "valid (" + e.ErrorKind.LocalizedString(printer) + ")"
		}
		if len(loc) == 0 {
			return []string{fmt.Sprintf("arguments must be %s, got %s", want, display(val))}
		}
		return []string{fmt.Sprintf("argument %q must be %s, got %s", argName(loc), want, display(val))}
	}
	if len(loc) == 0 {
		return []string{"arguments are invalid: " + e.ErrorKind.LocalizedString(printer)}
	}
	return []string{fmt.Sprintf("argument %q is invalid: %s", argName(loc), e.ErrorKind.LocalizedString(printer))}
}

// propertyName explains a key that fails "propertyNames". The library's instance location for it is not
// reliable, so the object is found from the schema location ("#/properties/env/propertyNames").
func (m *messenger) propertyName(e *jsonschema.ValidationError, name string) string {
	var loc, ptr []string
	if _, frag, ok := strings.Cut(e.SchemaURL, "#"); ok {
		ptr = strings.Split(strings.TrimPrefix(frag, "/"), "/")
		for i := 0; i+1 < len(ptr); i += 2 {
			if ptr[i] != "properties" {
				loc = nil
				break
			}
			loc = append(loc, strings.NewReplacer("~1", "/", "~0", "~").Replace(ptr[i+1]))
		}
	}
	pn := asMap(asMap(schemaAt(m.schema, loc))["propertyNames"])
	rule := "be " + describe(pn)
	if p, ok := pn["pattern"].(string); ok {
		rule = "match the pattern " + strconv.Quote(p)
	} else if pn == nil {
		rule = "be valid names"
	}
	if len(loc) == 0 {
		return fmt.Sprintf("argument name %q is invalid: names must %s", name, rule)
	}
	return fmt.Sprintf("argument %q has an invalid key %q: keys must %s", argName(loc), name, rule)
}

// argName renders an instance location as "env.PATH" or "items[0]".
func argName(loc []string) string {
	var b strings.Builder
	for i, tok := range loc {
		if _, err := strconv.Atoi(tok); err == nil && i > 0 {
			fmt.Fprintf(&b, "[%s]", tok)
			continue
		}
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(tok)
	}
	return b.String()
}

// schemaAt follows loc through "properties", "additionalProperties" and "items"; nil when it cannot.
func schemaAt(schema any, loc []string) any {
	s := schema
	for _, tok := range loc {
		m := asMap(s)
		if m == nil {
			return nil
		}
		if props := asMap(m["properties"]); props != nil && props[tok] != nil {
			s = props[tok]
			continue
		}
		if items, ok := m["items"]; ok {
			s = items
			continue
		}
		if ap, ok := m["additionalProperties"]; ok {
			s = ap
			continue
		}
		return nil
	}
	return s
}

func valueAt(inst any, loc []string) (any, bool) {
	v := inst
	for _, tok := range loc {
		switch x := v.(type) {
		case map[string]any:
			v = x[tok]
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(x) {
				return nil, false
			}
			v = x[i]
		default:
			return nil, false
		}
	}
	return v, true
}

func asMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

func propertyNames(schema any) []string {
	var names []string
	for name := range asMap(asMap(schema)["properties"]) {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// describe says in words what a value of schema must be: "an integer >= 1", "a non-empty string".
func describe(schema any) string {
	s := asMap(schema)
	if s == nil {
		return ""
	}
	if enum, ok := s["enum"].([]any); ok {
		var vals []string
		for _, v := range enum {
			vals = append(vals, display(v))
		}
		if len(vals) == 1 {
			return vals[0]
		}
		return "one of " + strings.Join(vals, ", ")
	}
	if c, ok := s["const"]; ok {
		return display(c)
	}
	var parts []string
	switch typ := s["type"].(type) {
	case string:
		parts = append(parts, typeWords(typ, s))
	case []any:
		var alts []string
		for _, t := range typ {
			if ts, ok := t.(string); ok {
				alts = append(alts, typeWords(ts, s))
			}
		}
		parts = append(parts, strings.Join(alts, " or "))
	default:
		parts = append(parts, "a value")
	}
	min, hasMin := number(s["minimum"])
	max, hasMax := number(s["maximum"])
	switch {
	case hasMin && hasMax:
		parts = append(parts, fmt.Sprintf("between %s and %s", min, max))
	case hasMin:
		parts = append(parts, ">= "+min)
	case hasMax:
		parts = append(parts, "<= "+max)
	}
	if x, ok := number(s["exclusiveMinimum"]); ok {
		parts = append(parts, "> "+x)
	}
	if x, ok := number(s["exclusiveMaximum"]); ok {
		parts = append(parts, "< "+x)
	}
	if x, ok := number(s["maxLength"]); ok {
		parts = append(parts, "of at most "+x+" characters")
	}
	if p, ok := s["pattern"].(string); ok {
		parts = append(parts, "matching the pattern "+strconv.Quote(p))
	}
	return strings.Join(parts, " ")
}

func typeWords(typ string, s map[string]any) string {
	switch typ {
	case "integer":
		return "an integer"
	case "number":
		return "a number"
	case "boolean":
		return "true or false"
	case "object":
		if ap, ok := s["additionalProperties"]; ok && asMap(ap) != nil {
			if d := describe(ap); d != "" {
				return "an object whose values are each " + d
			}
		}
		return "an object"
	case "array":
		return "an array"
	case "null":
		return "null"
	case "string":
		if n, ok := number(s["minLength"]); ok {
			if n == "1" {
				return "a non-empty string"
			}
			return "a string of at least " + n + " characters"
		}
		return "a string"
	}
	return typ
}

// number renders a schema number without a trailing ".0".
func number(v any) (string, bool) {
	switch x := v.(type) {
	case json.Number:
		return x.String(), true
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), true
	case int:
		return strconv.Itoa(x), true
	case *big.Rat:
		return x.RatString(), true
	}
	return "", false
}

// display renders an argument value for a message: JSON for scalars, cut at 60 characters.
func display(v any) string {
	switch v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	s := string(b)
	if len(s) > 60 {
		s = strings.ToValidUTF8(s[:57], "") + "..."
	}
	return s
}

func jsonKind(v any) string {
	switch v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return "a number"
}
