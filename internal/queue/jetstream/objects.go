package jetstream

import (
	"errors"
	"io"
)

// fullReads makes every Read of r fill its buffer unless r ends first. nats.go's object store publishes
// one chunk per Read of the reader it is given and keeps at most 4000 unacknowledged: a reader that
// returns a few kilobytes at a time (an HTTP request's body, a pipe) made ten times the chunks of a
// full read, and an upload of a few tens of megabytes failed with "stalled with too many outstanding
// async published messages". Filled reads make every chunk but the last the store's chunk size.
func fullReads(r io.Reader) io.Reader { return &fullReader{r: r} }

type fullReader struct {
	r   io.Reader
	err error // what ended r, returned once what was read before it has been
}

func (f *fullReader) Read(p []byte) (int, error) {
	if f.err != nil {
		return 0, f.err
	}
	n, err := io.ReadFull(f.r, p)
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF):
		f.err = io.EOF
		return n, nil
	case err != nil:
		f.err = err
		if n > 0 {
			return n, nil
		}
		return 0, err
	}
	return n, nil
}
