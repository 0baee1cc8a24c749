package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Object is one rendered document, decoded into its API type.
type Object struct {
	Source     string // where it came from: "# Source:" comment of helm template, else file#index
	APIVersion string
	Kind       string
	Name       string
	Namespace  string
	Typed      any // *appsv1.Deployment, ...; nil for an allowed kind without a schema
	Raw        map[string]any
}

// ID is Kind/name, as the -external flag spells it.
func (o *Object) ID() string { return o.Kind + "/" + o.Name }

func (o *Object) String() string { return fmt.Sprintf("%s %s (%s)", o.Kind, o.Name, o.Source) }

// kinds maps apiVersion/Kind to a constructor of its Go type: the kinds a toolpool chart may render. A kind
// missing here fails validation unless -allow-kind names it.
var kinds = map[string]func() any{
	"v1/ConfigMap":                             func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                                func() any { return &corev1.Secret{} },
	"v1/Service":                               func() any { return &corev1.Service{} },
	"v1/ServiceAccount":                        func() any { return &corev1.ServiceAccount{} },
	"v1/PersistentVolumeClaim":                 func() any { return &corev1.PersistentVolumeClaim{} },
	"v1/Pod":                                   func() any { return &corev1.Pod{} },
	"apps/v1/Deployment":                       func() any { return &appsv1.Deployment{} },
	"apps/v1/DaemonSet":                        func() any { return &appsv1.DaemonSet{} },
	"apps/v1/StatefulSet":                      func() any { return &appsv1.StatefulSet{} },
	"batch/v1/Job":                             func() any { return &batchv1.Job{} },
	"policy/v1/PodDisruptionBudget":            func() any { return &policyv1.PodDisruptionBudget{} },
	"autoscaling/v2/HorizontalPodAutoscaler":   func() any { return &autoscalingv2.HorizontalPodAutoscaler{} },
	"networking.k8s.io/v1/NetworkPolicy":       func() any { return &networkingv1.NetworkPolicy{} },
	"networking.k8s.io/v1/Ingress":             func() any { return &networkingv1.Ingress{} },
	"rbac.authorization.k8s.io/v1/Role":        func() any { return &rbacv1.Role{} },
	"rbac.authorization.k8s.io/v1/RoleBinding": func() any { return &rbacv1.RoleBinding{} },
	"monitoring.coreos.com/v1/ServiceMonitor":  func() any { return &monitoringv1.ServiceMonitor{} },
	"monitoring.coreos.com/v1/PodMonitor":      func() any { return &monitoringv1.PodMonitor{} },
	"monitoring.coreos.com/v1/PrometheusRule":  func() any { return &monitoringv1.PrometheusRule{} },
}

// ReadObjects splits a multi-document YAML stream and decodes every non-empty document strictly.
// Decoding errors of all documents are returned together.
func ReadObjects(name string, r io.Reader) ([]*Object, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReaderSize(r, 1<<20))
	var objs []*Object
	var errs []error
	for i := 0; ; i++ {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		source := sourceOf(doc, fmt.Sprintf("%s#%d", name, i))
		obj, err := decode(source, doc)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if obj != nil {
			objs = append(objs, obj)
		}
	}
	return objs, errors.Join(errs...)
}

// sourceOf returns the template named by helm's "# Source: chart/templates/x.yaml" comment.
func sourceOf(doc []byte, fallback string) string {
	for _, line := range strings.Split(string(doc), "\n") {
		if s, ok := strings.CutPrefix(line, "# Source: "); ok {
			return strings.TrimSpace(s)
		}
	}
	return fallback
}

// decode turns one YAML document into an Object; an empty document (only comments) is nil.
func decode(source string, doc []byte) (*Object, error) {
	// YAMLToJSONStrict fails on duplicate keys, which plain YAML decoding silently merges.
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return nil, fmt.Errorf("%s: not valid YAML: %w", source, err)
	}
	if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
		return nil, nil
	}
	var raw map[string]any
	if err := kjson.UnmarshalCaseSensitivePreserveInts(js, &raw); err != nil {
		return nil, fmt.Errorf("%s: a document must be a mapping: %w", source, err)
	}
	var tm metav1.TypeMeta
	var om struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	_ = kjson.UnmarshalCaseSensitivePreserveInts(js, &tm)
	_ = kjson.UnmarshalCaseSensitivePreserveInts(js, &om)
	obj := &Object{Source: source, APIVersion: tm.APIVersion, Kind: tm.Kind, Name: om.Metadata.Name, Namespace: om.Metadata.Namespace, Raw: raw}
	if tm.APIVersion == "" || tm.Kind == "" {
		return nil, fmt.Errorf("%s: apiVersion and kind are required", source)
	}
	newT, ok := kinds[tm.APIVersion+"/"+tm.Kind]
	if !ok {
		return obj, nil // Validate reports it unless allowed
	}
	typed := newT()
	strictErrs, err := kjson.UnmarshalStrict(js, typed, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return nil, fmt.Errorf("%s: %s %s: %w", source, tm.Kind, obj.Name, err)
	}
	if len(strictErrs) > 0 {
		msgs := make([]string, len(strictErrs))
		for i, e := range strictErrs {
			msgs[i] = e.Error()
		}
		return nil, fmt.Errorf("%s: %s %s: %s", source, tm.Kind, obj.Name, strings.Join(msgs, "; "))
	}
	obj.Typed = typed
	return obj, nil
}
