{{/* Names, labels and the values that several templates share. */}}

{{- define "toolpool.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The full name; object names add a suffix of at most 20 characters, so it is cut to 42. */}}
{{- define "toolpool.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 42 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 42 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 42 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "toolpool.dispatcher.fullname" -}}{{ include "toolpool.fullname" . }}-dispatcher{{- end -}}
{{- define "toolpool.worker.fullname" -}}{{ include "toolpool.fullname" . }}-worker{{- end -}}
{{- define "toolpool.nats.fullname" -}}{{ include "toolpool.fullname" . }}-nats{{- end -}}

{{- define "toolpool.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "toolpool.selectorLabels" -}}
app.kubernetes.io/name: {{ include "toolpool.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "toolpool.labels" -}}
helm.sh/chart: {{ include "toolpool.chart" . }}
{{ include "toolpool.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: toolpool
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Component labels: call with (dict "ctx" $ "component" "dispatcher"). */}}
{{- define "toolpool.componentSelectorLabels" -}}
{{ include "toolpool.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "toolpool.componentLabels" -}}
{{ include "toolpool.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "toolpool.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "toolpool.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* An image reference: call with (dict "image" .Values.x.image "ctx" $). */}}
{{- define "toolpool.image" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{/* imagePullSecrets: call as {{- with (include "toolpool.imagePullSecrets" .) }}{{ . | nindent 6 }}{{ end }} */}}
{{- define "toolpool.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets -}}
imagePullSecrets:
{{- range . }}
  - name: {{ if kindIs "map" . }}{{ .name }}{{ else }}{{ . }}{{ end }}
{{- end }}
{{- end -}}
{{- end -}}

{{/*
A generated secret value that survives upgrades: the value already in the cluster when there is one (helm
lookup; empty under helm template), else a random one. Memoised per render in .Values so that every template
that asks gets the same value. Call with (dict "ctx" $ "secret" NAME "key" KEY).
*/}}
{{- define "toolpool.generated" -}}
{{- $store := .ctx.Values.__generated | default dict -}}
{{- $id := printf "%s/%s" .secret .key -}}
{{- if not (hasKey $store $id) -}}
{{- $value := randAlphaNum 40 -}}
{{- $existing := lookup "v1" "Secret" .ctx.Release.Namespace .secret -}}
{{- if and $existing $existing.data (hasKey $existing.data .key) -}}
{{- $value = index $existing.data .key | b64dec -}}
{{- end -}}
{{- $_ := set $store $id $value -}}
{{- $_ := set .ctx.Values "__generated" $store -}}
{{- end -}}
{{- index $store $id -}}
{{- end -}}

{{- define "toolpool.bootstrapTokenSecret" -}}{{ include "toolpool.fullname" . }}-bootstrap-token{{- end -}}
{{- define "toolpool.natsSecret" -}}{{ include "toolpool.nats.fullname" . }}{{- end -}}

{{/* The Secret and key that hold the NATS URL the dispatcher and the workers connect to. */}}
{{- define "toolpool.natsURLSecretName" -}}
{{- if and (eq .Values.jetstream.mode "external") .Values.jetstream.external.existingSecret -}}
{{- .Values.jetstream.external.existingSecret -}}
{{- else -}}
{{- include "toolpool.natsSecret" . -}}
{{- end -}}
{{- end -}}

{{- define "toolpool.natsURLSecretKey" -}}
{{- if and (eq .Values.jetstream.mode "external") .Values.jetstream.external.existingSecret -}}
{{- .Values.jetstream.external.existingSecretKey -}}
{{- else -}}
url
{{- end -}}
{{- end -}}

{{/* The NATS URL, for the Secret the chart renders (builtin, or external given as url). */}}
{{- define "toolpool.natsURL" -}}
{{- if eq .Values.jetstream.mode "builtin" -}}
{{- $host := printf "%s.%s.svc" (include "toolpool.nats.fullname" .) .Release.Namespace -}}
{{- if .Values.jetstream.builtin.auth.enabled -}}
{{- printf "nats://%s:%s@%s:4222" .Values.jetstream.builtin.auth.user (include "toolpool.generated" (dict "ctx" . "secret" (include "toolpool.natsSecret" .) "key" "password")) $host -}}
{{- else -}}
{{- printf "nats://%s:4222" $host -}}
{{- end -}}
{{- else -}}
{{- tpl .Values.jetstream.external.url . -}}
{{- end -}}
{{- end -}}

{{/* The env var both binaries read the NATS URL from (expanded into --nats-url by the kubelet). */}}
{{- define "toolpool.natsURLEnv" -}}
- name: TOOLPOOL_NATS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "toolpool.natsURLSecretName" . }}
      key: {{ include "toolpool.natsURLSecretKey" . }}
{{- end -}}

{{/* Paths inside the pods. */}}
{{- define "toolpool.policyDir" -}}/etc/toolpool/policy{{- end -}}
{{- define "toolpool.policyEnabled" -}}
{{- if or .Values.policy.content .Values.policy.existingConfigMap -}}true{{- end -}}
{{- end -}}

{{/*
Checks that the schema cannot express (combinations of values). Every template includes it, so a bad
combination fails helm install and helm template with one clear message.
*/}}
{{- define "toolpool.validate" -}}
{{- $v := .Values -}}
{{- if and (eq $v.jetstream.mode "external") (not $v.jetstream.external.url) (not $v.jetstream.external.existingSecret) -}}
{{- fail "jetstream.mode is external: set jetstream.external.url (nats://host:4222) or jetstream.external.existingSecret" -}}
{{- end -}}
{{- if and $v.jetstream.external.url $v.jetstream.external.existingSecret -}}
{{- fail "jetstream.external: give url or existingSecret, not both" -}}
{{- end -}}
{{- if and (eq $v.jetstream.mode "builtin") (lt (int $v.jetstream.builtin.replicas) 3) (ne (int $v.jetstream.builtin.replicas) 1) -}}
{{- fail "jetstream.builtin.replicas must be 1 (no cluster) or at least 3 (a JetStream cluster needs a quorum)" -}}
{{- end -}}
{{- if and (not $v.dispatcher.existingConfigSecret.name) (not $v.dispatcher.tenants) (not $v.dispatcher.bootstrapTenant.enabled) -}}
{{- fail "the dispatcher has no tenants: add dispatcher.tenants, turn on dispatcher.bootstrapTenant, or set dispatcher.existingConfigSecret.name" -}}
{{- end -}}
{{- if and $v.dispatcher.existingConfigSecret.name (or $v.dispatcher.tenants) -}}
{{- fail "dispatcher.existingConfigSecret holds the tenants: leave dispatcher.tenants empty (or drop existingConfigSecret)" -}}
{{- end -}}
{{- if and $v.policy.content $v.policy.existingConfigMap -}}
{{- fail "policy: give content or existingConfigMap, not both" -}}
{{- end -}}
{{- if eq $v.worker.containerd.mode "node" -}}
{{- if ne $v.worker.kind "DaemonSet" -}}
{{- fail "worker.containerd.mode node needs worker.kind DaemonSet: workers sharing a node's containerd must be one per node" -}}
{{- end -}}
{{- if ne $v.worker.workspaces.type "hostPath" -}}
{{- fail "worker.containerd.mode node needs worker.workspaces.type hostPath: the node's containerd mounts the workspaces from the node's filesystem" -}}
{{- end -}}
{{- end -}}
{{- if and (eq $v.jetstream.mode "builtin") (not (kindIs "invalid" $v.jetstream.streamReplicas)) (gt (int $v.jetstream.streamReplicas) (int $v.jetstream.builtin.replicas)) -}}
{{- fail "jetstream.streamReplicas is above jetstream.builtin.replicas: a stream cannot have more replicas than there are servers" -}}
{{- end -}}
{{- if $v.dispatcher.autoscaling.enabled -}}
{{- if gt (int $v.dispatcher.autoscaling.minReplicas) (int $v.dispatcher.autoscaling.maxReplicas) -}}
{{- fail "dispatcher.autoscaling: minReplicas is above maxReplicas" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Default topology spread for a component: call with (dict "ctx" $ "component" NAME "hostname" "ScheduleAnyway"|"DoNotSchedule"). */}}
{{- define "toolpool.defaultSpread" -}}
- maxSkew: 1
  topologyKey: kubernetes.io/hostname
  whenUnsatisfiable: {{ .hostname }}
  labelSelector:
    matchLabels:
      {{- include "toolpool.componentSelectorLabels" (dict "ctx" .ctx "component" .component) | nindent 6 }}
- maxSkew: 1
  topologyKey: topology.kubernetes.io/zone
  whenUnsatisfiable: ScheduleAnyway
  labelSelector:
    matchLabels:
      {{- include "toolpool.componentSelectorLabels" (dict "ctx" .ctx "component" .component) | nindent 6 }}
{{- end -}}

{{/* NetworkPolicy egress rules to NATS and DNS, shared by the dispatcher and the workers. */}}
{{- define "toolpool.natsEgress" -}}
{{- if eq .Values.jetstream.mode "builtin" }}
- to:
    - podSelector:
        matchLabels:
          {{- include "toolpool.componentSelectorLabels" (dict "ctx" . "component" "nats") | nindent 10 }}
  ports:
    - port: 4222
      protocol: TCP
{{- else }}
- ports:
    - port: {{ .Values.networkPolicy.externalNATSPort }}
      protocol: TCP
  {{- with .Values.networkPolicy.externalNATSTo }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end -}}
{{- define "toolpool.dnsEgress" -}}
- ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
  {{- with .Values.networkPolicy.dnsTo }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/* Replicas of the JetStream stream and bucket. */}}
{{- define "toolpool.streamReplicas" -}}
{{- $js := .Values.jetstream -}}
{{- if not (kindIs "invalid" $js.streamReplicas) -}}
{{- $js.streamReplicas -}}
{{- else if eq $js.mode "builtin" -}}
{{- min 3 (int $js.builtin.replicas) -}}
{{- else -}}
1
{{- end -}}
{{- end -}}
