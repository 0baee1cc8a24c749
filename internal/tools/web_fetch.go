package tools

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/toolpool/toolpool/internal/tools/incontainer"
)

var webFetchTool = builtin{
	name: "web_fetch",
	kind: KindFetch,
	description: `Fetch a web page or text resource over http or https and return it as text: HTML is ` +
		`converted to readable Markdown (links kept, scripts and styles dropped), other text (plain text, JSON, ` +
		`XML, source code) is returned as is, and binary content (images, PDFs, archives) is refused. The output ` +
		`starts with the final URL (after redirects, at most 5) and the content type.
At most "max_bytes" of the converted text are returned (default 100000, at most 1000000); a longer page ends ` +
		`with a note giving the "offset" to call again with to read on. "raw": true returns the HTML source ` +
		`instead of Markdown. "timeout_ms" bounds the request (default 30000, at most 120000). Only public ` +
		`addresses can be reached (never localhost, private networks or cloud metadata), and the operator may ` +
		`limit which domains are allowed; a refused destination is an error that says why. Non-2xx answers are ` +
		`errors that include the start of the page.`,
	schema: `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "url": {"type": "string", "minLength": 1, "maxLength": 8192, "description": "The http:// or https:// URL to fetch."},
    "max_bytes": {"type": "integer", "minimum": 1000, "maximum": 1000000, "description": "How many bytes of text to return at most. Default 100000."},
    "offset": {"type": "integer", "minimum": 0, "description": "Skip this many bytes of the converted text (to read on after a cut). Default 0."},
    "raw": {"type": "boolean", "description": "Return HTML source instead of Markdown. Default false."},
    "timeout_ms": {"type": "integer", "minimum": 1000, "maximum": 120000, "description": "Give up after this many milliseconds. Default 30000."}
  },
  "required": ["url"],
  "additionalProperties": false
}`,
	timeout:     incontainer.WebFetchDefaultTimeout + 15*time.Second,
	outputBytes: incontainer.WebFetchMaxBytes + 4<<10,
	facts:       webFetchFacts,
	check:       webFetchCheck,
	runner:      true,
	egress:      true,
}

// webFetchURL is the argument of web_fetch that Facts and the check read.
type webFetchURL struct {
	URL string `json:"url"`
}

func webFetchFacts(args json.RawMessage) Facts {
	var a webFetchURL
	if json.Unmarshal(args, &a) != nil {
		return Facts{}
	}
	return Facts{URL: a.URL}
}

func webFetchCheck(args json.RawMessage) []string {
	var a webFetchURL
	if err := json.Unmarshal(args, &a); err != nil {
		return []string{fmt.Sprintf("arguments do not decode: %v", err)}
	}
	if _, err := incontainer.ParseFetchURL(a.URL); err != nil {
		return []string{fmt.Sprintf("argument \"url\" %v", err)}
	}
	return nil
}
