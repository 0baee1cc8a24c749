package main

import (
	"bytes"
	"strings"
	"testing"
)

// good is a small release that passes every check; each case below breaks it in one place.
const good = `
---
# Source: toolpool/templates/configmap.yaml
apiVersion: v1
kind: ConfigMap
metadata:
  name: app-config
data:
  config.yaml: "a: 1"
---
# Source: toolpool/templates/secret.yaml
apiVersion: v1
kind: Secret
metadata:
  name: app-nats
data:
  url: bmF0czovL3g6NDIyMg==
---
apiVersion: v1
kind: Service
metadata:
  name: app
  labels:
    toolpool.io/job: app
spec:
  selector:
    app: web
  ports:
    - name: http
      port: 8080
      targetPort: http
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: app
spec:
  replicas: 2
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
    spec:
      containers:
        - name: web
          image: example/web:1
          args: ["--nats-url=$(NATS_URL)"]
          env:
            - name: NATS_URL
              valueFrom:
                secretKeyRef:
                  name: app-nats
                  key: url
          ports:
            - name: http
              containerPort: 8080
          readinessProbe:
            httpGet:
              path: /readyz
              port: http
          resources:
            requests:
              memory: 128Mi
            limits:
              memory: 256Mi
          volumeMounts:
            - name: config
              mountPath: /etc/app
      volumes:
        - name: config
          configMap:
            name: app-config
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: app
spec:
  maxUnavailable: 1
  selector:
    matchLabels:
      app: web
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: app
spec:
  jobLabel: toolpool.io/job
  selector:
    matchLabels:
      toolpool.io/job: app
  endpoints:
    - port: http
      interval: 30s
---
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: app
spec:
  groups:
    - name: app
      rules:
        - alert: AppDown
          expr: up == 0
          for: 5m
`

func check(t *testing.T, manifest string, opts Options) []string {
	t.Helper()
	objs, err := ReadObjects("test", strings.NewReader(manifest))
	if err != nil {
		return []string{err.Error()}
	}
	return Validate(objs, opts)
}

func TestGoodManifestPasses(t *testing.T) {
	if problems := check(t, good, Options{}); len(problems) > 0 {
		t.Fatalf("problems in the good manifest:\n%s", strings.Join(problems, "\n"))
	}
}

func TestBrokenManifestsFail(t *testing.T) {
	cases := []struct {
		name, old, new, want string
		opts                 Options
	}{
		{name: "misspelt field", old: "  replicas: 2", new: "  replicas: 2\n  replcas: 2", want: `unknown field "spec.replcas"`},
		{name: "wrong case", old: "  replicas: 2", new: "  Replicas: 2", want: `unknown field "spec.Replicas"`},
		{name: "wrong type", old: "  replicas: 2", new: `  replicas: "two"`, want: "spec.replicas"},
		{name: "duplicate key", old: "  replicas: 2", new: "  replicas: 2\n  replicas: 3", want: `key "replicas" already set`},
		{name: "bad quantity", old: "memory: 256Mi", new: "memory: 256MB", want: "quantities must match"},
		{name: "unknown kind", old: "kind: PodDisruptionBudget", new: "kind: PodDisruptionBudgett", want: "has no schema here"},
		{name: "unknown kind allowed", old: "kind: PodDisruptionBudget\nmetadata:\n  name: app", new: "kind: Widget\nmetadata:\n  name: app", opts: Options{AllowKinds: []string{"policy/v1/Widget"}}},
		{name: "misspelt servicemonitor field", old: "      interval: 30s", new: "      intervall: 30s", want: `unknown field "spec.endpoints[0].intervall"`},
		{name: "misspelt rule field", old: "          for: 5m", new: "          fore: 5m", want: `unknown field "spec.groups[0].rules[0].fore"`},
		{name: "selector misses template", old: "      labels:\n        app: web\n    spec:", new: "      labels:\n        app: webb\n    spec:", want: "does not match the pod template"},
		{name: "service selects nothing", old: "  selector:\n    app: web\n  ports:", new: "  selector:\n    app: nope\n  ports:", want: "selects no pod"},
		{name: "service target port missing", old: "      targetPort: http", new: "      targetPort: htp", want: `targetPort "htp"`},
		{name: "probe port missing", old: "              port: http\n          resources", new: "              port: metrics\n          resources", want: `readinessProbe: port "metrics"`},
		{name: "volume missing", old: "            - name: config\n              mountPath", new: "            - name: cfg\n              mountPath", want: `volumeMount "cfg": no such volume`},
		{name: "configmap missing", old: "            name: app-config", new: "            name: app-cfg", want: `ConfigMap "app-cfg": no such ConfigMap`},
		{name: "secret key missing", old: "                  key: url", new: "                  key: uri", want: `has no key "uri"`},
		{name: "secret external", old: "                  name: app-nats", new: "                  name: theirs", opts: Options{External: []string{"Secret/theirs"}}},
		{name: "undefined env ref", old: "$(NATS_URL)", new: "$(NATS_URI)", want: "refers to $(NATS_URI)"},
		{name: "request above limit", old: "memory: 128Mi", new: "memory: 512Mi", want: "is above its limit"},
		{name: "bad label value", old: "    toolpool.io/job: app\nspec", new: "    toolpool.io/job: \"a b\"\nspec", want: "label toolpool.io/job value"},
		{name: "bad name", old: "  name: app-config", new: "  name: App_Config", want: "metadata.name"},
		{name: "servicemonitor port missing", old: "    - port: http\n      interval", new: "    - port: metrics\n      interval", want: `endpoint port "metrics"`},
		{name: "rule without alert", old: "        - alert: AppDown", new: "        - labels: {}", want: "give alert or record"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(good, tc.old) {
				t.Fatalf("the good manifest has no %q", tc.old)
			}
			problems := check(t, strings.Replace(good, tc.old, tc.new, 1), tc.opts)
			got := strings.Join(problems, "\n")
			if tc.want == "" {
				if got != "" {
					t.Fatalf("want no problem, got:\n%s", got)
				}
				return
			}
			if !strings.Contains(got, tc.want) {
				t.Fatalf("want a problem containing %q, got:\n%s", tc.want, got)
			}
		})
	}
}

func TestRunExitCodes(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(nil, strings.NewReader(good), &out, &errOut); code != 0 {
		t.Fatalf("good manifest: exit %d: %s", code, errOut.String())
	}
	errOut.Reset()
	if code := run(nil, strings.NewReader(strings.Replace(good, "  replicas: 2", "  replcas: 2", 1)), &out, &errOut); code != 1 {
		t.Fatalf("broken manifest: exit %d, want 1", code)
	}
	if !strings.Contains(errOut.String(), "toolpool/templates") && !strings.Contains(errOut.String(), "stdin#") {
		t.Fatalf("the report names no source: %s", errOut.String())
	}
}
