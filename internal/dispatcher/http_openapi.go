package dispatcher

import (
	_ "embed"
	"net/http"
)

// openAPI is the REST API's contract, an OpenAPI 3.1 document (openapi.json beside this file), served as
// is at GET /v1/openapi.json without authentication. test/clients validates real answers of every
// operation it lists against it, so a change to a handler's answers must change it too.
//
//go:embed openapi.json
var openAPI []byte

func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(openAPI)
}
