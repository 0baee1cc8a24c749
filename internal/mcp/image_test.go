package mcp

import (
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestImageMeta: a tools/call's _meta "toolpool/image" is the call's image, as "image" is on POST
// /v1/calls; anything but a string is refused before a call is made.
func TestImageMeta(t *testing.T) {
	f := newFake(t)
	srv := server(t, f, testConfig(), false)
	cs := connect(t, srv.URL, nil)
	if res := callTool(t, cs, "echo", sdk.Meta{ImageMeta: "registry.example.com/tools/python:3.12"}); res.IsError {
		t.Fatalf("call with an image: %q", text(res))
	}
	res := callTool(t, cs, "echo", sdk.Meta{ImageMeta: 42})
	if !res.IsError || !strings.Contains(text(res), `"toolpool/image" must be an image reference`) {
		t.Errorf("a number as the image: isError %v, text %q", res.IsError, text(res))
	}
	if submitted, _, _, _ := f.snapshot(); len(submitted) != 1 || submitted[0].Image != "registry.example.com/tools/python:3.12" {
		t.Errorf("submitted %+v, want one call on the _meta image", submitted)
	}
}
