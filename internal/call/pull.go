package call

import "fmt"

// StreamPull names, in a running call's live output, the records of its image's pull: not an output
// stream of the call, but one JSON PullProgress a line, which the event stream shows as status events.
const StreamPull = "pull"

// PullProgress is how far the pull of a call's image is, while the call waits for it: BytesDone of
// BytesTotal bytes of the image's content (config and layers, compressed, as its manifest gives them)
// are on the worker. BytesTotal is 0 until the manifest is read.
type PullProgress struct {
	Image      string `json:"image"`
	BytesDone  int64  `json:"bytes_done"`
	BytesTotal int64  `json:"bytes_total"`
	// Phase is "fetching" (the content comes in), "unpacking" (into the worker's snapshots) or "done".
	Phase string `json:"phase"`
}

// String is one line for people: "pulling image R: 4.4 MB of 5.7 MB (77%)".
func (p PullProgress) String() string {
	switch {
	case p.Phase == "done":
		return fmt.Sprintf("pulled image %s: %s", p.Image, megabytes(p.BytesTotal))
	case p.Phase == "unpacking":
		return fmt.Sprintf("unpacking image %s: %s", p.Image, megabytes(p.BytesTotal))
	case p.BytesTotal == 0:
		return fmt.Sprintf("pulling image %s", p.Image)
	}
	return fmt.Sprintf("pulling image %s: %s of %s (%d%%)", p.Image, megabytes(p.BytesDone), megabytes(p.BytesTotal), p.BytesDone*100/p.BytesTotal)
}

func megabytes(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }
