package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"syscall"

	"github.com/toolpool/toolpool/internal/console"
	"github.com/toolpool/toolpool/internal/dispatcher"
	"github.com/toolpool/toolpool/internal/mcp"
	"github.com/toolpool/toolpool/internal/metrics"
	"github.com/toolpool/toolpool/internal/queue/jetstream"
	"github.com/toolpool/toolpool/internal/tools"
	"github.com/toolpool/toolpool/internal/yamlfile"
)

// config is the dispatcher's whole configuration, loaded in one path (loadConfig): defaults, then the
// YAML file, then flags, then the values derived from others, then validate. The library configs it
// holds (api, mcp, queue, reconciler) start from their packages' DefaultConfig.
type config struct {
	Listen     string `yaml:"listen"`
	DataDir    string `yaml:"data_dir"`
	NATSURL    string `yaml:"nats_url"`
	NATSListen string `yaml:"nats_listen"`
	// NATSSync is "always" (fsync before every acknowledgement, the default) or "interval".
	NATSSync   string            `yaml:"nats_sync"`
	PolicyFile string            `yaml:"policy_file"`
	LogLevel   string            `yaml:"log_level"`
	API        dispatcher.Config `yaml:"api"`
	// MCP is the /mcp endpoint's configuration; its body limit is the API's (derive).
	MCP   mcp.Config       `yaml:"mcp"`
	Queue jetstream.Config `yaml:"queue"`
	// Reconciler settles the calls no worker will (every replica runs one); its in-flight age defaults
	// to twice the queue's ack wait, and its waiting age is the API's queue timeout (derive).
	Reconciler dispatcher.ReconcilerConfig `yaml:"reconciler"`
	Metrics    metrics.Options             `yaml:"metrics"`
	// Console is the web console's (/console/) configuration: the workers' metrics its pool page reads.
	Console console.Config `yaml:"console"`
	Tools   struct {
		Custom []tools.CustomTool `yaml:"custom"`
	} `yaml:"tools"`
}

// defaults returns the configuration before the file and flags: the command's own defaults, and the
// libraries'.
func defaults() config {
	return config{
		Listen: "127.0.0.1:8080", DataDir: "/var/lib/toolpool/dispatcher", NATSListen: jetstream.DefaultListen,
		NATSSync: "always", LogLevel: "info", API: dispatcher.DefaultConfig(), MCP: mcp.DefaultConfig(), Queue: jetstream.DefaultConfig(),
		Reconciler: dispatcher.DefaultReconcilerConfig(),
		Metrics:    metrics.DefaultOptions(),
		Console:    console.DefaultConfig(),
	}
}

// errPrintPolicy is loadConfig's answer to --print-default-policy: print the policy and exit.
var errPrintPolicy = errors.New("print the default policy")

// loadConfig is the dispatcher's one path to its configuration: defaults, then the file (-config), then
// the flags set on the command line, then the values derived from others (derive), then validate.
func loadConfig(args []string) (config, error) {
	cfg := defaults()
	fs := flag.NewFlagSet("dispatcher", flag.ContinueOnError)
	configPath := fs.String("config", "", "YAML config file")
	listen := fs.String("listen", "", "HTTP listen address (default "+cfg.Listen+")")
	dataDir := fs.String("data-dir", "", "state directory (default "+cfg.DataDir+")")
	natsURL := fs.String("nats-url", "", "external NATS URL; empty embeds a NATS server")
	natsListen := fs.String("nats-listen", "", "embedded NATS listen address for workers (default "+cfg.NATSListen+")")
	policyFile := fs.String("policy", "", "policy file (default: the shipped default policy)")
	logLevel := fs.String("log-level", "", "debug, info, warn or error")
	printPolicy := fs.Bool("print-default-policy", false, "print the shipped default policy (a starting point for --policy) and exit")
	devTenant := fs.Bool("dev-tenant", false, "add tenant 'dev' whose token is $TOOLPOOL_TOKEN (default 'dev'), with the approver role")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if *printPolicy {
		return cfg, errPrintPolicy
	}
	if *configPath != "" {
		if err := yamlfile.Decode(*configPath, &cfg); err != nil {
			return cfg, err
		}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for name, p := range map[string]struct{ dst, v *string }{
		"listen": {&cfg.Listen, listen}, "data-dir": {&cfg.DataDir, dataDir}, "nats-url": {&cfg.NATSURL, natsURL},
		"nats-listen": {&cfg.NATSListen, natsListen}, "policy": {&cfg.PolicyFile, policyFile}, "log-level": {&cfg.LogLevel, logLevel},
	} {
		if set[name] {
			*p.dst = *p.v
		}
	}
	if *devTenant {
		token := os.Getenv("TOOLPOOL_TOKEN")
		if token == "" {
			token = "dev"
		}
		cfg.API.Tenants = append(cfg.API.Tenants, dispatcher.Tenant{Name: "dev", Tokens: []dispatcher.Token{{Token: token, Role: dispatcher.RoleApprover}}})
	}
	cfg.derive()
	return cfg, cfg.validate()
}

// derive fills the values that follow from others once the file and flags are in: the MCP endpoint's
// body limit is the API's, the reconciler's ages follow the queue's ack wait and the API's queue timeout.
func (c *config) derive() {
	if abs, err := filepath.Abs(c.DataDir); err == nil {
		c.DataDir = abs
	}
	c.MCP.MaxBodyBytes = c.API.MaxBodyBytes
	if c.Reconciler.InFlightAge == 0 && c.Queue.AckWait > 0 { // a bad ack wait is the queue's to refuse
		c.Reconciler.InFlightAge = 2 * c.Queue.AckWait
	}
	c.Reconciler.WaitingAge = c.API.QueueTimeout
}

// validate checks what can be checked before anything starts, each bad value with what to change. What
// depends on the NATS server (a call's arguments within its max payload) is checked once connected
// (checkMessageSize).
func (c *config) validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("listen %q is not host:port: %w", c.Listen, err))
	}
	if _, _, err := net.SplitHostPort(c.NATSListen); c.NATSURL == "" && err != nil {
		errs = append(errs, fmt.Errorf("nats_listen %q is not host:port: %w: set --nats-listen (nats_listen), or --nats-url (nats_url) for an external server", c.NATSListen, err))
	}
	if c.NATSSync != "always" && c.NATSSync != "interval" {
		errs = append(errs, fmt.Errorf("nats_sync %q is not always or interval: set always (the default) or interval", c.NATSSync))
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		errs = append(errs, fmt.Errorf("log level %q is not debug, info, warn or error", c.LogLevel))
	}
	if err := c.API.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Console.Validate(); err != nil {
		errs = append(errs, err)
	}
	// A call stays in the queue while it waits and while it runs: the queue must keep it longer than both.
	if longest := c.API.QueueTimeout + c.API.MaxTimeout; c.Queue.MaxAge <= longest {
		errs = append(errs, fmt.Errorf("queue max_age %s must be longer than api queue_timeout plus api max_timeout (%s): raise queue.max_age or lower those", c.Queue.MaxAge, longest))
	}
	if c.Reconciler.Interval <= 0 || c.Reconciler.Grace <= 0 || c.Reconciler.InFlightAge < 0 {
		errs = append(errs, fmt.Errorf("reconciler interval and grace must be positive, in_flight_age not negative (interval %s, grace %s, in_flight_age %s): set them, or leave them out for the defaults",
			c.Reconciler.Interval, c.Reconciler.Grace, c.Reconciler.InFlightAge))
	}
	if err := c.MCP.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// checkMessageSize refuses a request body limit that would let a call outgrow one queue message.
func checkMessageSize(maxBody, maxMessage int64) error {
	const overhead = 16 << 10 // the call's other fields and the message headers
	if maxBody+overhead > maxMessage {
		return fmt.Errorf("api max_body_bytes %d leaves no room in the NATS server's max payload of %d bytes (a call's arguments travel in one message): set api.max_body_bytes to at most %d",
			maxBody, maxMessage, maxMessage-overhead)
	}
	return nil
}

// listenHTTP opens the API's listener on addr, or says which setting to change when it cannot.
func listenHTTP(addr string) (net.Listener, error) {
	return listen(addr, "--listen (listen)")
}

// checkNATSListen checks that the embedded NATS server can listen on addr: it opens the address and closes
// it again. The server itself would only report "not ready" after its start timeout.
func checkNATSListen(addr string) error {
	ln, err := listen(addr, "--nats-listen (nats_listen), or set --nats-url (nats_url) to use an external NATS server")
	if err != nil {
		return fmt.Errorf("embedded nats: %w", err)
	}
	return ln.Close()
}

// listen listens on TCP address addr; its error names setting, the one to change.
func listen(addr, setting string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return nil, fmt.Errorf("address %s is in use by another process: change %s: %w", addr, setting, err)
	case err != nil:
		return nil, fmt.Errorf("listen on %s: change %s: %w", addr, setting, err)
	}
	return ln, nil
}
