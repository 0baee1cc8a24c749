package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
)

// Forward is the in-container side of egress for commands: it accepts connections on l (a loopback
// address the container's HTTP_PROXY and HTTPS_PROXY name) and joins each, byte for byte, to a new
// connection to the proxy's unix socket. It never parses what it carries and decides nothing: the proxy
// at the other end of the socket checks every request and CONNECT. A program that kills the forwarder or
// talks to the socket directly gains nothing; without it, the container has loopback only.
//
// Forward blocks until ctx ends (then it closes l and every open connection and returns nil) or l fails
// (then it returns the error).
func Forward(ctx context.Context, l net.Listener, socket string) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	for {
		conn, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("forward egress: %w", err)
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("forward egress: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var d net.Dialer
			proxy, err := d.DialContext(ctx, "unix", socket)
			if err != nil {
				conn.Close() // the client sees the connection closed: no proxy, no network
				return
			}
			tunnel(ctx, conn, nil, proxy)
		}()
	}
}
