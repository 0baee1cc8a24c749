package main

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Options tune Validate.
type Options struct {
	// External lists Kind/name of objects the release refers to without rendering them.
	External []string
	// AllowKinds lists apiVersion/Kind accepted without a schema.
	AllowKinds []string
}

// podTemplate is a workload's pod template with the workload's selector.
type podTemplate struct {
	owner    *Object
	selector *metav1.LabelSelector
	labels   map[string]string
	spec     *corev1.PodSpec
	claims   []string // StatefulSet volumeClaimTemplates
}

type checker struct {
	opts     Options
	objs     []*Object
	byID     map[string]*Object
	pods     []podTemplate
	problems []string
}

// Validate checks each object and the references between them. It returns one line per problem.
func Validate(objs []*Object, opts Options) []string {
	c := &checker{opts: opts, objs: objs, byID: map[string]*Object{}}
	for _, o := range objs {
		key := o.Kind + "/" + o.Namespace + "/" + o.Name
		if _, dup := c.byID[key]; dup {
			c.report(o, "rendered twice")
		}
		c.byID[key] = o
		c.byID[o.ID()] = o
	}
	for _, o := range objs {
		if pt, ok := podTemplateOf(o); ok {
			c.pods = append(c.pods, pt)
		}
	}
	for _, o := range objs {
		c.checkObject(o)
	}
	return c.problems
}

func (c *checker) report(o *Object, format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf("%s: %s %q: %s", o.Source, o.Kind, o.Name, fmt.Sprintf(format, args...)))
}

// exists says whether Kind/name is rendered or declared external.
func (c *checker) exists(kind, name string) bool {
	if _, ok := c.byID[kind+"/"+name]; ok {
		return true
	}
	return slices.Contains(c.opts.External, kind+"/"+name)
}

func podTemplateOf(o *Object) (podTemplate, bool) {
	switch t := o.Typed.(type) {
	case *appsv1.Deployment:
		return podTemplate{o, t.Spec.Selector, t.Spec.Template.Labels, &t.Spec.Template.Spec, nil}, true
	case *appsv1.DaemonSet:
		return podTemplate{o, t.Spec.Selector, t.Spec.Template.Labels, &t.Spec.Template.Spec, nil}, true
	case *appsv1.StatefulSet:
		var claims []string
		for _, pvc := range t.Spec.VolumeClaimTemplates {
			claims = append(claims, pvc.Name)
		}
		return podTemplate{o, t.Spec.Selector, t.Spec.Template.Labels, &t.Spec.Template.Spec, claims}, true
	case *batchv1.Job:
		return podTemplate{o, t.Spec.Selector, t.Spec.Template.Labels, &t.Spec.Template.Spec, nil}, true
	case *corev1.Pod:
		return podTemplate{o, nil, t.Labels, &t.Spec, nil}, true
	}
	return podTemplate{}, false
}

func (c *checker) checkObject(o *Object) {
	if o.Typed == nil {
		if !slices.Contains(c.opts.AllowKinds, o.APIVersion+"/"+o.Kind) {
			c.report(o, "apiVersion %s kind %s has no schema here: a typo, or add it to the validator (or -allow-kind %s/%s)", o.APIVersion, o.Kind, o.APIVersion, o.Kind)
		}
		return
	}
	c.checkMeta(o)
	switch t := o.Typed.(type) {
	case *appsv1.Deployment:
		c.checkSelector(o, t.Spec.Selector, t.Spec.Template.Labels)
	case *appsv1.DaemonSet:
		c.checkSelector(o, t.Spec.Selector, t.Spec.Template.Labels)
	case *appsv1.StatefulSet:
		c.checkSelector(o, t.Spec.Selector, t.Spec.Template.Labels)
		if t.Spec.ServiceName != "" && !c.exists("Service", t.Spec.ServiceName) {
			c.report(o, "serviceName %q: no such Service", t.Spec.ServiceName)
		}
	case *corev1.Service:
		c.checkService(o, t)
	case *policyv1.PodDisruptionBudget:
		if t.Spec.MinAvailable != nil && t.Spec.MaxUnavailable != nil {
			c.report(o, "minAvailable and maxUnavailable are both set")
		}
		if len(c.selected(t.Spec.Selector)) == 0 {
			c.report(o, "selector %s selects no pod of the release", metav1.FormatLabelSelector(t.Spec.Selector))
		}
	case *autoscalingv2.HorizontalPodAutoscaler:
		ref := t.Spec.ScaleTargetRef
		if !c.exists(ref.Kind, ref.Name) {
			c.report(o, "scaleTargetRef %s/%s: no such object", ref.Kind, ref.Name)
		}
		if t.Spec.MinReplicas != nil && *t.Spec.MinReplicas > t.Spec.MaxReplicas {
			c.report(o, "minReplicas %d is above maxReplicas %d", *t.Spec.MinReplicas, t.Spec.MaxReplicas)
		}
	case *networkingv1.NetworkPolicy:
		c.checkNetworkPolicy(o, t)
	case *networkingv1.Ingress:
		c.checkIngress(o, t)
	case *monitoringv1.ServiceMonitor:
		c.checkServiceMonitor(o, t)
	case *monitoringv1.PrometheusRule:
		c.checkPrometheusRule(o, t)
	}
	if pt, ok := podTemplateOf(o); ok {
		c.checkPodSpec(o, pt)
	}
}

func (c *checker) checkMeta(o *Object) {
	if o.Name == "" {
		c.report(o, "metadata.name is empty")
		return
	}
	nameCheck := validation.IsDNS1123Subdomain
	switch o.Kind {
	case "Service":
		nameCheck = validation.IsDNS1035Label
	case "StatefulSet":
		// Its pods' controller-revision-hash label is NAME-HASH, a label value of at most 63 characters.
		if len(o.Name) > 52 {
			c.report(o, "name is %d characters: its pods' controller-revision-hash label needs it at most 52", len(o.Name))
		}
	}
	for _, msg := range nameCheck(o.Name) {
		c.report(o, "metadata.name: %s", msg)
	}
	meta := metaOf(o)
	for k, v := range meta.Labels {
		for _, msg := range validation.IsQualifiedName(k) {
			c.report(o, "label key %q: %s", k, msg)
		}
		for _, msg := range validation.IsValidLabelValue(v) {
			c.report(o, "label %s value %q: %s", k, v, msg)
		}
	}
	for k := range meta.Annotations {
		for _, msg := range validation.IsQualifiedName(strings.ToLower(k)) {
			c.report(o, "annotation key %q: %s", k, msg)
		}
	}
}

func metaOf(o *Object) metav1.ObjectMeta {
	if m, ok := o.Typed.(metav1.ObjectMetaAccessor); ok {
		return *m.GetObjectMeta().(*metav1.ObjectMeta)
	}
	return metav1.ObjectMeta{}
}

func (c *checker) checkSelector(o *Object, sel *metav1.LabelSelector, tmplLabels map[string]string) {
	if sel == nil {
		c.report(o, "spec.selector is required")
		return
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		c.report(o, "spec.selector: %v", err)
		return
	}
	if s.Empty() || !s.Matches(labels.Set(tmplLabels)) {
		c.report(o, "spec.selector %s does not match the pod template's labels %v", s, tmplLabels)
	}
}

// selected returns the pod templates a selector matches.
func (c *checker) selected(sel *metav1.LabelSelector) []podTemplate {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return nil
	}
	var out []podTemplate
	for _, pt := range c.pods {
		if s.Matches(labels.Set(pt.labels)) {
			out = append(out, pt)
		}
	}
	return out
}

// hasPort says whether a container of the pods has the named (or numbered) port.
func hasPort(pods []podTemplate, port intstr.IntOrString) bool {
	for _, pt := range pods {
		for _, ctr := range pt.spec.Containers {
			for _, p := range ctr.Ports {
				if port.Type == intstr.String && p.Name == port.StrVal {
					return true
				}
				if port.Type == intstr.Int && p.ContainerPort == port.IntVal {
					return true
				}
			}
		}
	}
	return false
}

func (c *checker) checkService(o *Object, svc *corev1.Service) {
	if len(svc.Spec.Selector) == 0 {
		return // an ExternalName or manually managed endpoints
	}
	pods := c.selected(&metav1.LabelSelector{MatchLabels: svc.Spec.Selector})
	if len(pods) == 0 {
		c.report(o, "selector %v selects no pod of the release", svc.Spec.Selector)
		return
	}
	names := map[string]bool{}
	for _, p := range svc.Spec.Ports {
		if names[p.Name] {
			c.report(o, "port name %q is used twice", p.Name)
		}
		names[p.Name] = true
		target := p.TargetPort
		if target.Type == intstr.Int && target.IntVal == 0 {
			target = intstr.FromInt32(p.Port)
		}
		if target.Type == intstr.String && !hasPort(pods, target) {
			c.report(o, "port %q: targetPort %q is no container port of the selected pods", p.Name, target.StrVal)
		}
	}
}

func (c *checker) checkNetworkPolicy(o *Object, np *networkingv1.NetworkPolicy) {
	pods := c.selected(&np.Spec.PodSelector)
	if len(pods) == 0 {
		c.report(o, "podSelector %s selects no pod of the release", metav1.FormatLabelSelector(&np.Spec.PodSelector))
		return
	}
	for i, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			if p.Port != nil && p.Port.Type == intstr.String && !hasPort(pods, *p.Port) {
				c.report(o, "ingress[%d]: port %q is no container port of the selected pods", i, p.Port.StrVal)
			}
		}
		for j, peer := range rule.From {
			c.checkPeer(o, fmt.Sprintf("ingress[%d].from[%d]", i, j), peer)
		}
	}
	for i, rule := range np.Spec.Egress {
		for j, peer := range rule.To {
			c.checkPeer(o, fmt.Sprintf("egress[%d].to[%d]", i, j), peer)
			// A peer that selects the release's pods by label must select some.
			if peer.PodSelector != nil && peer.NamespaceSelector == nil && len(peer.PodSelector.MatchLabels) > 0 &&
				peer.PodSelector.MatchLabels["app.kubernetes.io/instance"] != "" && len(c.selected(peer.PodSelector)) == 0 {
				c.report(o, "egress[%d].to[%d]: podSelector %s selects no pod of the release", i, j, metav1.FormatLabelSelector(peer.PodSelector))
			}
		}
	}
}

func (c *checker) checkPeer(o *Object, where string, peer networkingv1.NetworkPolicyPeer) {
	if peer.IPBlock != nil && (peer.PodSelector != nil || peer.NamespaceSelector != nil) {
		c.report(o, "%s: ipBlock cannot be combined with a selector", where)
	}
	if peer.IPBlock == nil && peer.PodSelector == nil && peer.NamespaceSelector == nil {
		c.report(o, "%s: a peer needs podSelector, namespaceSelector or ipBlock", where)
	}
}

func (c *checker) checkIngress(o *Object, ing *networkingv1.Ingress) {
	for _, rule := range ing.Spec.Rules {
		if rule.HTTP == nil {
			continue
		}
		for _, p := range rule.HTTP.Paths {
			svc := p.Backend.Service
			if svc == nil {
				continue
			}
			target, ok := c.byID["Service/"+svc.Name]
			if !ok {
				c.report(o, "backend service %q: no such Service", svc.Name)
				continue
			}
			if svc.Port.Name != "" && !slices.ContainsFunc(target.Typed.(*corev1.Service).Spec.Ports, func(sp corev1.ServicePort) bool { return sp.Name == svc.Port.Name }) {
				c.report(o, "backend service %q has no port %q", svc.Name, svc.Port.Name)
			}
		}
	}
}

func (c *checker) checkServiceMonitor(o *Object, sm *monitoringv1.ServiceMonitor) {
	s, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil {
		c.report(o, "selector: %v", err)
		return
	}
	var svcs []*corev1.Service
	for _, other := range c.objs {
		if svc, ok := other.Typed.(*corev1.Service); ok && s.Matches(labels.Set(svc.Labels)) {
			svcs = append(svcs, svc)
		}
	}
	if len(svcs) == 0 {
		c.report(o, "selector %s selects no Service of the release", s)
		return
	}
	for _, svc := range svcs {
		if sm.Spec.JobLabel != "" && svc.Labels[sm.Spec.JobLabel] == "" {
			c.report(o, "jobLabel %q: Service %s has no such label", sm.Spec.JobLabel, svc.Name)
		}
		for _, ep := range sm.Spec.Endpoints {
			if ep.Port != "" && !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) {
				c.report(o, "endpoint port %q: Service %s has no such port", ep.Port, svc.Name)
			}
		}
	}
}

func (c *checker) checkPrometheusRule(o *Object, pr *monitoringv1.PrometheusRule) {
	if len(pr.Spec.Groups) == 0 {
		c.report(o, "no rule groups")
	}
	groups := map[string]bool{}
	for _, g := range pr.Spec.Groups {
		if groups[g.Name] {
			c.report(o, "group %q is defined twice", g.Name)
		}
		groups[g.Name] = true
		for i, r := range g.Rules {
			if (r.Alert == "") == (r.Record == "") {
				c.report(o, "group %q rule %d: give alert or record, exactly one", g.Name, i)
			}
			if strings.TrimSpace(r.Expr.String()) == "" {
				c.report(o, "group %q rule %d (%s%s): expr is empty", g.Name, i, r.Alert, r.Record)
			}
		}
	}
}

var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

func (c *checker) checkPodSpec(o *Object, pt podTemplate) {
	spec := pt.spec
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		if _, dup := volumes[v.Name]; dup {
			c.report(o, "volume %q is defined twice", v.Name)
		}
		volumes[v.Name] = v
		c.checkVolumeSource(o, v)
	}
	for _, claim := range pt.claims {
		volumes[claim] = corev1.Volume{Name: claim}
	}
	if sa := spec.ServiceAccountName; sa != "" && sa != "default" && !c.exists("ServiceAccount", sa) {
		c.report(o, "serviceAccountName %q: no such ServiceAccount", sa)
	}
	portNames := map[string]bool{}
	names := map[string]bool{}
	all := append(slices.Clone(spec.InitContainers), spec.Containers...)
	if len(spec.Containers) == 0 {
		c.report(o, "the pod has no containers")
	}
	for _, ctr := range all {
		where := "container " + ctr.Name
		for _, msg := range validation.IsDNS1123Label(ctr.Name) {
			c.report(o, "%s: name: %s", where, msg)
		}
		if names[ctr.Name] {
			c.report(o, "%s: the name is used twice", where)
		}
		names[ctr.Name] = true
		if ctr.Image == "" {
			c.report(o, "%s: image is empty", where)
		}
		for _, p := range ctr.Ports {
			if p.Name == "" {
				continue
			}
			for _, msg := range validation.IsValidPortName(p.Name) {
				c.report(o, "%s: port name %q: %s", where, p.Name, msg)
			}
			if portNames[p.Name] {
				c.report(o, "%s: port name %q is used twice in the pod", where, p.Name)
			}
			portNames[p.Name] = true
		}
		for probeName, probe := range map[string]*corev1.Probe{"livenessProbe": ctr.LivenessProbe, "readinessProbe": ctr.ReadinessProbe, "startupProbe": ctr.StartupProbe} {
			if probe == nil {
				continue
			}
			var port *intstr.IntOrString
			switch {
			case probe.HTTPGet != nil:
				port = &probe.HTTPGet.Port
			case probe.TCPSocket != nil:
				port = &probe.TCPSocket.Port
			}
			if port != nil && port.Type == intstr.String && !slices.ContainsFunc(ctr.Ports, func(p corev1.ContainerPort) bool { return p.Name == port.StrVal }) {
				c.report(o, "%s: %s: port %q is not a port of the container", where, probeName, port.StrVal)
			}
		}
		mounts := map[string]bool{}
		for _, m := range ctr.VolumeMounts {
			if _, ok := volumes[m.Name]; !ok {
				c.report(o, "%s: volumeMount %q: no such volume", where, m.Name)
			}
			if !path.IsAbs(m.MountPath) {
				c.report(o, "%s: volumeMount %q: mountPath %q is not absolute", where, m.Name, m.MountPath)
			}
			if mounts[m.MountPath] {
				c.report(o, "%s: mountPath %q is mounted twice", where, m.MountPath)
			}
			mounts[m.MountPath] = true
		}
		env := map[string]bool{}
		for _, e := range ctr.Env {
			env[e.Name] = true
			if e.ValueFrom != nil {
				if r := e.ValueFrom.SecretKeyRef; r != nil && (r.Optional == nil || !*r.Optional) {
					c.checkKeyRef(o, where+" env "+e.Name, "Secret", r.Name, r.Key)
				}
				if r := e.ValueFrom.ConfigMapKeyRef; r != nil && (r.Optional == nil || !*r.Optional) {
					c.checkKeyRef(o, where+" env "+e.Name, "ConfigMap", r.Name, r.Key)
				}
			}
		}
		// $(VAR) in command, args and env values is expanded by the kubelet only when VAR is defined
		// earlier: otherwise the process sees the literal text.
		var defined []string
		for _, e := range ctr.Env {
			for _, m := range envRef.FindAllStringSubmatch(e.Value, -1) {
				if !slices.Contains(defined, m[1]) {
					c.report(o, "%s: env %s refers to $(%s), which is not defined before it", where, e.Name, m[1])
				}
			}
			defined = append(defined, e.Name)
		}
		for _, s := range append(slices.Clone(ctr.Command), ctr.Args...) {
			for _, m := range envRef.FindAllStringSubmatch(s, -1) {
				if !env[m[1]] {
					c.report(o, "%s: %q refers to $(%s), which is not an env var of the container", where, s, m[1])
				}
			}
		}
		for _, ef := range ctr.EnvFrom {
			if ef.SecretRef != nil && (ef.SecretRef.Optional == nil || !*ef.SecretRef.Optional) && !c.exists("Secret", ef.SecretRef.Name) {
				c.report(o, "%s: envFrom Secret %q: no such Secret", where, ef.SecretRef.Name)
			}
			if ef.ConfigMapRef != nil && (ef.ConfigMapRef.Optional == nil || !*ef.ConfigMapRef.Optional) && !c.exists("ConfigMap", ef.ConfigMapRef.Name) {
				c.report(o, "%s: envFrom ConfigMap %q: no such ConfigMap", where, ef.ConfigMapRef.Name)
			}
		}
		for res, limit := range ctr.Resources.Limits {
			if req, ok := ctr.Resources.Requests[res]; ok && req.Cmp(limit) > 0 {
				c.report(o, "%s: %s request %s is above its limit %s", where, res, req.String(), limit.String())
			}
		}
		if sc := ctr.SecurityContext; sc != nil {
			if sc.Privileged != nil && *sc.Privileged && sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
				c.report(o, "%s: privileged with allowPrivilegeEscalation false is rejected by the API server", where)
			}
			if sc.RunAsNonRoot != nil && *sc.RunAsNonRoot && sc.RunAsUser != nil && *sc.RunAsUser == 0 {
				c.report(o, "%s: runAsNonRoot with runAsUser 0 can never start", where)
			}
		}
	}
}

func (c *checker) checkVolumeSource(o *Object, v corev1.Volume) {
	where := "volume " + v.Name
	switch {
	case v.ConfigMap != nil:
		if v.ConfigMap.Optional == nil || !*v.ConfigMap.Optional {
			for _, it := range v.ConfigMap.Items {
				c.checkKeyRef(o, where, "ConfigMap", v.ConfigMap.Name, it.Key)
			}
			if len(v.ConfigMap.Items) == 0 && !c.exists("ConfigMap", v.ConfigMap.Name) {
				c.report(o, "%s: ConfigMap %q: no such ConfigMap", where, v.ConfigMap.Name)
			}
		}
	case v.Secret != nil:
		if v.Secret.Optional == nil || !*v.Secret.Optional {
			for _, it := range v.Secret.Items {
				c.checkKeyRef(o, where, "Secret", v.Secret.SecretName, it.Key)
			}
			if len(v.Secret.Items) == 0 && !c.exists("Secret", v.Secret.SecretName) {
				c.report(o, "%s: Secret %q: no such Secret", where, v.Secret.SecretName)
			}
		}
	case v.PersistentVolumeClaim != nil:
		if !c.exists("PersistentVolumeClaim", v.PersistentVolumeClaim.ClaimName) {
			c.report(o, "%s: PersistentVolumeClaim %q: no such claim", where, v.PersistentVolumeClaim.ClaimName)
		}
	case v.HostPath != nil:
		if !path.IsAbs(v.HostPath.Path) {
			c.report(o, "%s: hostPath %q is not absolute", where, v.HostPath.Path)
		}
	}
}

// checkKeyRef checks that a rendered ConfigMap or Secret has the key (an external one is trusted).
func (c *checker) checkKeyRef(o *Object, where, kind, name, key string) {
	target, ok := c.byID[kind+"/"+name]
	if !ok {
		if !c.exists(kind, name) {
			c.report(o, "%s: %s %q: no such %s (declare an existing one with -external %s/%s)", where, kind, name, kind, kind, name)
		}
		return
	}
	var has bool
	switch t := target.Typed.(type) {
	case *corev1.ConfigMap:
		_, has = t.Data[key]
		if !has {
			_, has = t.BinaryData[key]
		}
	case *corev1.Secret:
		_, has = t.Data[key]
		if !has {
			_, has = t.StringData[key]
		}
	}
	if !has {
		c.report(o, "%s: %s %q has no key %q", where, kind, name, key)
	}
}
