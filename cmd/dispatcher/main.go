// Command dispatcher serves toolpool's HTTP API. It embeds a NATS server with JetStream on disk unless
// --nats-url points it at an external one.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolpool/toolpool/internal/audit"
	"github.com/toolpool/toolpool/internal/console"
	"github.com/toolpool/toolpool/internal/dispatcher"
	"github.com/toolpool/toolpool/internal/mcp"
	"github.com/toolpool/toolpool/internal/metrics"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/queue/jetstream"
	"github.com/toolpool/toolpool/internal/tools"
	"github.com/toolpool/toolpool/internal/tracing"
	"github.com/toolpool/toolpool/internal/workspace"
)

// allowRulesKey names the approve-always rules in the shared state bucket.
const allowRulesKey = "allow_rules"

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "dispatcher:", err)
		os.Exit(1)
	}
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

// run serves until a signal, then shuts down in order: stop taking requests and finish those in flight,
// stop the reconciler and the policy watch and join every goroutine, then close the queue connection and
// the embedded NATS server.
func run(args []string) error {
	cfg, err := loadConfig(args)
	if errors.Is(err, errPrintPolicy) {
		_, err = os.Stdout.Write(policy.DefaultYAML())
		return err
	}
	if err != nil {
		return err
	}
	// The addresses first: one that is taken fails the start at once, naming the setting to change, before
	// anything else starts (an embedded NATS server on a taken port would only time out).
	ln, err := listenHTTP(cfg.Listen)
	if err != nil {
		return err
	}
	defer ln.Close()
	if cfg.NATSURL == "" {
		if err := checkNATSListen(cfg.NATSListen); err != nil {
			return err
		}
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
			return fmt.Errorf("%w: fix the file, or point --policy (policy_file) at another", err)
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
	// Every goroutine below is joined before the connection closes: the context ends them.
	var bg sync.WaitGroup
	defer func() {
		stop()
		bg.Wait()
	}()
	if err := checkMessageSize(cfg.API.MaxBodyBytes, conn.MaxMessage()); err != nil {
		return err
	}
	dm.WatchNATS(conn.Ready)
	dm.WatchQueue(func(ctx context.Context) (metrics.QueueState, error) {
		st, err := conn.Calls().State(ctx)
		return metrics.QueueState{Pending: st.Pending, Oldest: st.OldestAge, Lanes: st.Lanes}, err
	})
	dm.WatchApprovals(func(ctx context.Context) (int, error) {
		p, err := conn.Approvals().ListPending(ctx, "*")
		return len(p), err
	})

	// Policy: hot-reloaded from its file; approve-always rules are shared by every replica through NATS.
	pstore := policy.NewStore(pol, policy.KnownTools(append(reg.Names(), workspace.Ops...)...))
	if cfg.PolicyFile != "" {
		bg.Go(func() {
			_ = pstore.Watch(ctx, cfg.PolicyFile, 2*time.Second, func(err error) {
				dm.PolicyReload(err)
				if err != nil {
					log.Error("reload policy: keeping the previous one", "file", cfg.PolicyFile, "error", err)
					return
				}
				log.Info("reloaded policy", "file", cfg.PolicyFile)
			})
		})
	}
	rules, err := shareAllowRules(ctx, conn, pstore, log)
	if err != nil {
		return err
	}

	// The call store, decorated: audit log, then metrics, then tracing (outermost).
	audited := audit.Wrap(conn.Records(), conn.Audit(), func(err error) { log.Warn("write audit event", "error", err) })
	store := tracing.TraceStore(metrics.ObserveStore(audited, dm))
	// A call naming a workspace goes to the worker that holds the workspace, while it lives.
	router := dispatcher.NewHomeRouter(conn.Calls(), conn.Residents())
	dm.WatchRouting(router.Counts)
	publisher := tracing.TracePublisher(router)
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
	reconciler, err := dispatcher.NewReconciler(cfg.Reconciler, dispatcher.ReconcilerDeps{
		Store: store, Backlog: conn.Backlog(), LeaseHeld: conn.Leases().LeaseHeld, Approvals: conn.Approvals(), Publisher: publisher, Tools: reg,
		Log: log.With("part", "reconciler"), Now: conn.Now,
	})
	if err != nil {
		return err
	}
	bg.Go(func() { reconciler.Run(ctx) })
	// MCP's Streamable HTTP endpoint: the same tokens, and calls through the API's own call path.
	mcpCfg := cfg.MCP
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		mcpCfg.Version = bi.Main.Version
	}
	mcpHandler, err := mcp.New(mcpCfg, api, api, log, mcp.WithOutput(conn.Live()))
	if err != nil {
		return err
	}
	// The web console: pages over the API above, in process, as the signed-in token (docs/console.md).
	webConsole, err := console.New(cfg.Console, api.Handler(), promReg, log.With("part", "console"))
	if err != nil {
		return err
	}
	root := http.NewServeMux()
	root.Handle("GET /metrics", metrics.Handler(promReg))
	root.Handle(console.Prefix+"/", tracing.HTTPHandler(dm.InstrumentHTTP(webConsole)))
	root.Handle("/mcp", tracing.HTTPHandler(dm.InstrumentHTTP(api.Authenticate(mcpHandler))))
	root.Handle("/", tracing.HTTPHandler(dm.InstrumentHTTP(api.Handler())))
	srv := &http.Server{
		Handler:           root,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
	errCh := make(chan error, 1)
	bg.Go(func() { errCh <- srv.Serve(ln) })
	defer srv.Close() // after Shutdown, a no-op; on any other return, Serve returns before the join
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
