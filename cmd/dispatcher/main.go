// Command dispatcher serves toolpool's HTTP API. It embeds a NATS server with JetStream on disk unless
// --nats-url points it at an external one.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/toolpool/toolpool/internal/audit"
	"github.com/toolpool/toolpool/internal/dispatcher"
	"github.com/toolpool/toolpool/internal/mcp"
	"github.com/toolpool/toolpool/internal/metrics"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/queue/jetstream"
	"github.com/toolpool/toolpool/internal/tools"
	"github.com/toolpool/toolpool/internal/tracing"
	"github.com/toolpool/toolpool/internal/workspace"
)

// config is the dispatcher's whole configuration: defaults, then the YAML file, then flags, then Validate.
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
	MCP        mcp.Config        `yaml:"mcp"`
	Queue      jetstream.Config  `yaml:"queue"`
	// Reconciler settles the calls no worker will (every replica runs one).
	Reconciler dispatcher.ReconcilerConfig `yaml:"reconciler"`
	Metrics    metrics.Options             `yaml:"metrics"`
	Tools      struct {
		Custom []tools.CustomTool `yaml:"custom"`
	} `yaml:"tools"`
}

func defaults() config {
	return config{
		Listen: "127.0.0.1:8080", DataDir: "/var/lib/toolpool/dispatcher", NATSListen: "127.0.0.1:4222",
		NATSSync: "always", LogLevel: "info", API: dispatcher.DefaultConfig(), MCP: mcp.DefaultConfig(), Queue: jetstream.DefaultConfig(),
		Reconciler: dispatcher.DefaultReconcilerConfig(),
		Metrics:    metrics.Options{TenantLabel: true, MaxTenants: metrics.DefaultMaxTenants},
	}
}

func (c *config) validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("listen %q: %w", c.Listen, err))
	}
	if c.NATSSync != "always" && c.NATSSync != "interval" {
		errs = append(errs, fmt.Errorf("nats_sync %q is not always or interval", c.NATSSync))
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		errs = append(errs, fmt.Errorf("log level %q is not debug, info, warn or error", c.LogLevel))
	}
	if err := c.API.Validate(); err != nil {
		errs = append(errs, err)
	}
	// A call stays in the queue while it waits and while it runs: the queue must keep it longer than both.
	if longest := c.API.QueueTimeout + c.API.MaxTimeout; c.Queue.MaxAge <= longest {
		errs = append(errs, fmt.Errorf("queue max_age %s must be longer than api queue_timeout plus api max_timeout (%s): raise queue.max_age or lower those", c.Queue.MaxAge, longest))
	}
	if c.Reconciler.Interval <= 0 || c.Reconciler.Grace <= 0 || c.Reconciler.InFlightAge < 0 {
		errs = append(errs, errors.New("reconciler interval and grace must be positive, in_flight_age not negative"))
	}
	c.MCP.MaxBodyBytes = c.API.MaxBodyBytes
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

// allowRulesKey names the approve-always rules in the shared state bucket.
const allowRulesKey = "allow_rules"

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "dispatcher:", err)
		os.Exit(1)
	}
}

func loadConfig(args []string) (config, error) {
	cfg := defaults()
	fs := flag.NewFlagSet("dispatcher", flag.ContinueOnError)
	configPath := fs.String("config", "", "YAML config file")
	listen := fs.String("listen", "", "HTTP listen address (default 127.0.0.1:8080)")
	dataDir := fs.String("data-dir", "", "state directory (default /var/lib/toolpool/dispatcher)")
	natsURL := fs.String("nats-url", "", "external NATS URL; empty embeds a NATS server")
	natsListen := fs.String("nats-listen", "", "embedded NATS listen address for workers (default 127.0.0.1:4222)")
	policyFile := fs.String("policy", "", "policy file (default: the shipped default policy)")
	logLevel := fs.String("log-level", "", "debug, info, warn or error")
	printPolicy := fs.Bool("print-default-policy", false, "print the shipped default policy (a starting point for --policy) and exit")
	devTenant := fs.Bool("dev-tenant", false, "add tenant 'dev' whose token is $TOOLPOOL_TOKEN (default 'dev'), with the approver role")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if *printPolicy {
		os.Stdout.Write(policy.DefaultYAML())
		os.Exit(0)
	}
	if *configPath != "" {
		f, err := os.Open(*configPath)
		if err != nil {
			return cfg, fmt.Errorf("open config: %w", err)
		}
		dec := yaml.NewDecoder(f)
		dec.KnownFields(true)
		err = dec.Decode(&cfg)
		f.Close()
		if err != nil {
			return cfg, fmt.Errorf("read config %s: %w", *configPath, err)
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
	if abs, err := filepath.Abs(cfg.DataDir); err == nil {
		cfg.DataDir = abs
	}
	return cfg, cfg.validate()
}

// shareAllowRules keeps pstore's approve-always rules in the state bucket that every replica shares, so
// that they survive a restart: it applies the stored rules, shortly after it returns, and whatever another
// replica stores later, until ctx ends. The rule book it returns adds a rule to the shared list by
// compare-and-set, so that replicas adding rules at once keep them all.
func shareAllowRules(ctx context.Context, conn *jetstream.Conn, pstore *policy.Store, log *slog.Logger) (*dispatcher.SharedRules, error) {
	if err := conn.SharedState().WatchState(ctx, allowRulesKey, func(b []byte) {
		var rules []policy.AllowRule
		if err := json.Unmarshal(b, &rules); err != nil {
			log.Error("decode approve-always rules", "error", err)
			return
		}
		if err := pstore.SetAllowRules(rules); err != nil {
			log.Error("apply approve-always rules", "error", err)
		}
	}); err != nil {
		return nil, err
	}
	return dispatcher.NewSharedRules(conn.SharedState(), allowRulesKey, pstore), nil
}

func run(args []string) error {
	cfg, err := loadConfig(args)
	if err != nil {
		return err
	}
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	log := slog.New(tracing.LogHandler(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))).With("component", "dispatcher")

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()

	// Tracing is off (no-op, no cost) unless an OTEL_* exporter variable is set.
	shutdownTracing, err := tracing.Setup(ctx, "toolpool-dispatcher", tracing.WithLogger(log))
	if err != nil {
		return err
	}
	defer tracing.Flush(shutdownTracing)
	promReg := prometheus.NewRegistry()
	dm := metrics.NewDispatcher(promReg, cfg.Metrics)

	reg, err := tools.NewRegistry(cfg.Tools.Custom...)
	if err != nil {
		return fmt.Errorf("load tools: %w", err)
	}
	pol := policy.Default()
	if cfg.PolicyFile != "" {
		if pol, err = policy.Load(cfg.PolicyFile, policy.KnownTools(append(reg.Names(), workspace.Ops...)...)); err != nil {
			return err
		}
	}

	natsURL := cfg.NATSURL
	if natsURL == "" {
		srv, err := jetstream.StartEmbedded(jetstream.EmbeddedConfig{
			Listen: cfg.NATSListen, StoreDir: filepath.Join(cfg.DataDir, "jetstream"), SyncAlways: cfg.NATSSync == "always",
		})
		if err != nil {
			return err
		}
		defer srv.Shutdown()
		natsURL = srv.URL()
		log.Info("started embedded nats", "url", natsURL, "store", filepath.Join(cfg.DataDir, "jetstream"))
	}
	qcfg := cfg.Queue
	qcfg.URL, qcfg.Name, qcfg.Provision = natsURL, "dispatcher", true
	conn, err := jetstream.Connect(ctx, qcfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := checkMessageSize(cfg.API.MaxBodyBytes, conn.MaxMessage()); err != nil {
		return err
	}
	dm.WatchNATS(conn.Ready)
	dm.WatchQueue(func(ctx context.Context) (uint64, time.Duration, error) {
		st, err := conn.Calls().State(ctx)
		return st.Pending, st.OldestAge, err
	})
	dm.WatchApprovals(func(ctx context.Context) (int, error) {
		p, err := conn.Approvals().ListPending(ctx, "*")
		return len(p), err
	})

	// Policy: hot-reloaded from its file; approve-always rules are shared by every replica through NATS.
	pstore := policy.NewStore(pol, policy.KnownTools(append(reg.Names(), workspace.Ops...)...))
	if cfg.PolicyFile != "" {
		go func() {
			_ = pstore.Watch(ctx, cfg.PolicyFile, 2*time.Second, func(err error) {
				dm.PolicyReload(err)
				if err != nil {
					log.Error("reload policy: keeping the previous one", "file", cfg.PolicyFile, "error", err)
					return
				}
				log.Info("reloaded policy", "file", cfg.PolicyFile)
			})
		}()
	}
	rules, err := shareAllowRules(ctx, conn, pstore, log)
	if err != nil {
		return err
	}

	// The call store, decorated: audit log, then metrics, then tracing (outermost).
	audited := audit.Wrap(conn.Records(), conn.Audit(), func(err error) { log.Warn("write audit event", "error", err) })
	store := tracing.TraceStore(metrics.ObserveStore(audited, dm))
	publisher := tracing.TracePublisher(conn.Calls())
	api, err := dispatcher.New(cfg.API,
		dispatcher.Deps{
			Store:     store,
			Publisher: publisher,
			Tools:     reg,
			Policy:    tracing.TracePolicy(pstore),
			Approvals: conn.Approvals(),
			Log:       log,
		},
		dispatcher.WithReadyChecks(conn.Ready),
		dispatcher.WithAudit(conn.Audit(), audited),
		dispatcher.WithRuleBook(rules, nil),
		dispatcher.WithOutputs(conn.Outputs()),
		dispatcher.WithLive(conn.Live()),
		dispatcher.WithTransfers(conn.Outputs()),
		dispatcher.WithClock(conn.Now),
	)
	if err != nil {
		return err
	}
	rcfg := cfg.Reconciler
	if rcfg.InFlightAge == 0 {
		rcfg.InFlightAge = 2 * conn.AckWait()
	}
	rcfg.WaitingAge = cfg.API.QueueTimeout
	reconciler, err := dispatcher.NewReconciler(rcfg, dispatcher.ReconcilerDeps{
		Store: store, Backlog: conn.Backlog(), LeaseHeld: conn.Leases().LeaseHeld, Approvals: conn.Approvals(), Publisher: publisher, Tools: reg,
		Log: log.With("part", "reconciler"), Now: conn.Now,
	})
	if err != nil {
		return err
	}
	go reconciler.Run(ctx)
	// MCP's Streamable HTTP endpoint: the same tokens, and calls through the API's own call path.
	mcpCfg := cfg.MCP
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		mcpCfg.Version = bi.Main.Version
	}
	mcpHandler, err := mcp.New(mcpCfg, api, api, log, mcp.WithOutput(conn.Live()))
	if err != nil {
		return err
	}
	root := http.NewServeMux()
	root.Handle("GET /metrics", metrics.Handler(promReg))
	root.Handle("/mcp", tracing.HTTPHandler(dm.InstrumentHTTP(api.Authenticate(mcpHandler))))
	root.Handle("/", tracing.HTTPHandler(dm.InstrumentHTTP(api.Handler())))
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	srv := &http.Server{
		Handler:           root,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
	errCh := make(chan error, 1)
	go func() { errCh <- srv.Serve(ln) }()
	log.Info("dispatcher ready", "listen", ln.Addr().String(), "nats", natsURL, "tenants", len(cfg.API.Tenants))
	select {
	case err := <-errCh:
		return fmt.Errorf("serve http: %w", err)
	case <-ctx.Done():
	}
	log.Info("dispatcher stopping: finishing in-flight requests")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); errors.Is(err, context.DeadlineExceeded) {
		// Requests that wait long (an MCP tools/call waiting for its result or a person's answer, a
		// long poll) are cut: their calls live on in JetStream, for another replica to answer about.
		log.Warn("dispatcher stopping: closing requests still open after 30s")
		mcpHandler.Drain() // the calls of the MCP requests cut now run on
		if err := srv.Close(); err != nil {
			return fmt.Errorf("close http: %w", err)
		}
	} else if err != nil {
		return fmt.Errorf("shut down http: %w", err)
	}
	return nil
}
