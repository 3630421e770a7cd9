{{/* Names and labels. */}}
{{- define "llm-sidecar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "llm-sidecar.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "llm-sidecar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "llm-sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The chart's own labels of every object it renders. */}}
{{- define "llm-sidecar.ownLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "llm-sidecar.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: llm-sidecar
{{- end -}}

{{/*
Metadata entries (labels or annotations) added to some already written: (list $written $a $b ...)
gives each key of $a, then of $b, ... that is neither written nor given before, as YAML lines
(string values; keys quoted where YAML would read them as something else). So the chart's own
labels win over prometheus.extraLabels, and both over commonLabels: a selector keeps working.
*/}}
{{- define "llm-sidecar.moreMeta" -}}
{{- $seen := deepCopy (first .) -}}
{{- $lines := list -}}
{{- range $more := rest . -}}
{{- range $key, $value := $more -}}
{{- if not (hasKey $seen $key) -}}
{{- $_ := set $seen $key true -}}
{{- $plain := and (regexMatch "^[A-Za-z][-A-Za-z0-9_./]*$" $key) (not (regexMatch "^(?i)(y|yes|n|no|true|false|on|off|null)$" $key)) -}}
{{- $lines = append $lines (printf "%s: %s" (ternary $key (quote $key) $plain) (quote (toString $value))) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- join "\n" $lines -}}
{{- end -}}

{{/* The labels of every object: the chart's own, then commonLabels. */}}
{{- define "llm-sidecar.labels" -}}
{{- include "llm-sidecar.labelsWith" (dict "root" . "own" (dict)) -}}
{{- end -}}

{{/* The same with labels of the object's own: (dict "root" $ "own" (dict "grafana_dashboard" "1")). */}}
{{- define "llm-sidecar.labelsWith" -}}
{{- $own := include "llm-sidecar.ownLabels" .root -}}
{{ $own }}
{{- with include "llm-sidecar.moreMeta" (list (fromYaml $own) .own .root.Values.commonLabels) }}
{{ . }}
{{- end }}
{{- end -}}

{{/* Labels of the objects Prometheus Operator selects (monitors, rules): the chart's own,
release=<prometheus.release>, prometheus.extraLabels, then commonLabels. */}}
{{- define "llm-sidecar.prometheusLabels" -}}
{{- $own := include "llm-sidecar.ownLabels" . -}}
{{ $own }}
{{- $release := dict -}}
{{- with .Values.prometheus.release }}{{ $_ := set $release "release" . }}{{ end -}}
{{- with include "llm-sidecar.moreMeta" (list (fromYaml $own) $release .Values.prometheus.extraLabels .Values.commonLabels) }}
{{ . }}
{{- end }}
{{- end -}}

{{/* An object's annotations block: (dict "root" $ "own" $itsAnnotations), then commonAnnotations;
nothing when both are empty. */}}
{{- define "llm-sidecar.annotations" -}}
{{- with include "llm-sidecar.moreMeta" (list (dict) (default (dict) .own) .root.Values.commonAnnotations) -}}
annotations:
  {{- . | nindent 2 }}
{{- end -}}
{{- end -}}

{{/* The pods' ServiceAccount: the one the chart creates (serviceAccount.name, default the
fullname), or serviceAccount.name, or "" (the namespace's default). */}}
{{- define "llm-sidecar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "llm-sidecar.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* "true" when the chart renders a Service for the admin port alone (<fullname>-metrics): what
a ServiceMonitor scrapes, so the clients' Service never carries the admin port for it. */}}
{{- define "llm-sidecar.metricsService" -}}
{{- if and .Values.prometheus.monitor.enabled (eq .Values.prometheus.monitor.kind "ServiceMonitor") }}true{{ end -}}
{{- end -}}

{{/* The labels a ServiceMonitor selects its Service by, and that Service carries. */}}
{{- define "llm-sidecar.metricsServiceLabels" -}}
{{ include "llm-sidecar.selectorLabels" . }}
app.kubernetes.io/component: metrics
{{- end -}}

{{/* The pods the monitors scrape: the chart's own, or the existing server's. */}}
{{- define "llm-sidecar.monitoredPodLabels" -}}
{{- if eq .Values.mode "full" -}}
{{ include "llm-sidecar.selectorLabels" . }}
{{- else -}}
{{ toYaml .Values.existingServer.podSelector }}
{{- end -}}
{{- end -}}

{{/* Every scraped series gets job=<prometheus.monitor.jobLabel>, which the rules' LLMSidecarDown watches. */}}
{{- define "llm-sidecar.scrapeEndpoint" -}}
port: metrics
path: /metrics
{{- with .Values.prometheus.monitor.interval }}
interval: {{ . }}
{{- end }}
{{- with .Values.prometheus.monitor.scrapeTimeout }}
scrapeTimeout: {{ . }}
{{- end }}
relabelings:
  {{- with include "llm-sidecar.sidecarContainerOnly" . }}{{ . | nindent 2 }}{{ end }}
  {{- include "llm-sidecar.releaseRelabeling" . | nindent 2 }}
  - action: replace
    targetLabel: job
    replacement: {{ .Values.prometheus.monitor.jobLabel | quote }}
{{- end -}}

{{/*
The release's own series (docs/kubernetes.md "Which pods a release judges"): every series a
monitor scrapes gets llm_release="<monitor namespace>/<monitor name>", which the release's
rules select. The Prometheus Operator gives a PodMonitor's targets the job
"<PodMonitor namespace>/<PodMonitor name>" just before these relabelings, so it is copied
before job is replaced; a ServiceMonitor's job is the Service's name, but the chart's
ServiceMonitor watches its own namespace only, the namespace label's. Made at scrape time, so
the plain manifests are right in whichever namespace they are applied to.
*/}}
{{/* A PodMonitor scrapes every container port named "metrics" in the pods it selects: in
monitoring-only the server's own container may have one (vLLM's is often named so), which would
be a target that is not a sidecar, down or foreign, and page LLMSidecarDown. Only the sidecar's
container (always named llm-sidecar, the snippet's name) is kept. A ServiceMonitor goes through
the chart's own Service, which targets the sidecar's port. */}}
{{- define "llm-sidecar.sidecarContainerOnly" -}}
{{- if eq .Values.prometheus.monitor.kind "PodMonitor" -}}
- action: keep
  sourceLabels: [__meta_kubernetes_pod_container_name]
  regex: llm-sidecar
{{- end -}}
{{- end -}}

{{- define "llm-sidecar.releaseRelabeling" -}}
{{- if eq .Values.prometheus.monitor.kind "ServiceMonitor" -}}
- action: replace
  sourceLabels: [namespace]
  targetLabel: llm_release
  replacement: {{ printf "${1}/%s" (include "llm-sidecar.fullname" .) | quote }}
{{- else -}}
- action: replace
  sourceLabels: [job]
  targetLabel: llm_release
{{- end -}}
{{- end -}}

{{/* The rules' matcher of the release's series: llm_release="<namespace>/<fullname>", or with
prometheus.rules.anyNamespace the name in any namespace (for manifests applied with kubectl -n). */}}
{{- define "llm-sidecar.releaseMatcher" -}}
{{- if .Values.prometheus.rules.anyNamespace -}}
llm_release=~".+/{{ include "llm-sidecar.fullname" . }}"
{{- else -}}
llm_release="{{ .Release.Namespace }}/{{ include "llm-sidecar.fullname" . }}"
{{- end -}}
{{- end -}}

{{/* The model server's own /metrics, relayed by the sidecar's admin port, as job=<engine.jobLabel>. */}}
{{- define "llm-sidecar.engineScrapeEndpoint" -}}
port: metrics
path: /metrics/engine
{{- with .Values.prometheus.monitor.interval }}
interval: {{ . }}
{{- end }}
{{- with .Values.prometheus.monitor.scrapeTimeout }}
scrapeTimeout: {{ . }}
{{- end }}
relabelings:
  {{- with include "llm-sidecar.sidecarContainerOnly" . }}{{ . | nindent 2 }}{{ end }}
  {{- include "llm-sidecar.releaseRelabeling" . | nindent 2 }}
  - action: replace
    targetLabel: job
    replacement: {{ .Values.prometheus.monitor.engine.jobLabel | quote }}
{{- end -}}

{{/* "true" when the monitor also scrapes the engine's own metrics (/metrics/engine): set, or by
default in mode full only. In monitoring-only the server is yours, and likely scraped already:
a second scrape would store every vllm:* series twice (and double sums over them). */}}
{{- define "llm-sidecar.engineScrape" -}}
{{- $on := .Values.prometheus.monitor.engine.enabled -}}
{{- if kindIs "invalid" $on -}}{{- $on = eq .Values.mode "full" -}}{{- end -}}
{{- if $on }}true{{ end -}}
{{- end -}}

{{/* A dashboard's uid for this release: the generator's uid and 8 hex digits of
<namespace>/<fullname>, so two releases (of one name in two namespaces, too) never share one and
Grafana never lets one overwrite the other. (list $ "llm-sidecar-slo") -> llm-sidecar-slo-1a2b3c4d */}}
{{- define "llm-sidecar.dashboardUid" -}}
{{- $root := index . 0 -}}
{{- printf "%s-%s" (index . 1) (sha256sum (printf "%s/%s" $root.Release.Namespace (include "llm-sidecar.fullname" $root)) | trunc 8) -}}
{{- end -}}

{{/* A dashboard's title for this release (Grafana wants titles unique within a folder). */}}
{{- define "llm-sidecar.dashboardTitle" -}}
{{- $root := index . 0 -}}
{{- printf "%s (%s/%s)" (index . 1) $root.Release.Namespace (include "llm-sidecar.fullname" $root) -}}
{{- end -}}

{{/* "true" when the sidecar is a native sidecar (an init container with restartPolicy: Always). */}}
{{- define "llm-sidecar.native" -}}
{{- $native := toString .Values.sidecar.native -}}
{{- if eq $native "auto" -}}
{{- if semverCompare ">=1.29-0" .Capabilities.KubeVersion.Version }}true{{ end -}}
{{- else if eq $native "true" -}}
true
{{- end -}}
{{- end -}}

{{- define "llm-sidecar.upstream" -}}
{{- if .Values.sidecar.upstream -}}
{{- .Values.sidecar.upstream -}}
{{- else if eq .Values.mode "full" -}}
{{- printf "http://127.0.0.1:%d" (int .Values.modelServer.port) -}}
{{- else -}}
{{- printf "http://127.0.0.1:%d" (int .Values.existingServer.port) -}}
{{- end -}}
{{- end -}}

{{/* A number as llm-sidecar reads it: integers without an exponent, others as they are. */}}
{{- define "llm-sidecar.number" -}}
{{- if eq (float64 .) (float64 (int64 .)) -}}{{ int64 . }}{{- else -}}{{ . }}{{- end -}}
{{- end -}}

{{/* The model server's preStop seconds (none in monitoring-only mode: not our container). */}}
{{- define "llm-sidecar.preStopSeconds" -}}
{{- if eq .Values.mode "full" -}}{{ int64 .Values.modelServer.preStopSeconds }}{{- else -}}0{{- end -}}
{{- end -}}

{{/* terminationGracePeriodSeconds: set and checked, or computed from the preStop and drain. */}}
{{- define "llm-sidecar.terminationGracePeriodSeconds" -}}
{{- $drain := float64 .Values.sidecar.drainSeconds -}}
{{- $preStop := int64 (include "llm-sidecar.preStopSeconds" .) -}}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds -}}
{{- add (int64 (ceil $drain)) $preStop 15 -}}
{{- else -}}
{{- $grace := int64 .Values.terminationGracePeriodSeconds -}}
{{- if le (float64 $grace) (addf $drain $preStop) -}}
{{- fail (printf "terminationGracePeriodSeconds (%d) must exceed sidecar.drainSeconds (%v) plus modelServer.preStopSeconds (%d): the kubelet would kill in-flight streams before the sidecar has drained them" $grace $drain $preStop) -}}
{{- end -}}
{{- $grace -}}
{{- end -}}
{{- end -}}

{{/*
A preStop that sleeps: the kubelet's own sleep action from Kubernetes 1.30 (beta, on by
default), an exec of `sleep` before it (the server's image must have one; vLLM's does).
*/}}
{{- define "llm-sidecar.preStopSleep" -}}
{{- if semverCompare ">=1.30-0" .root.Capabilities.KubeVersion.Version -}}
sleep:
  seconds: {{ int64 .seconds }}
{{- else -}}
exec:
  command: [sleep, {{ int64 .seconds | toString | quote }}]
{{- end -}}
{{- end -}}

{{/* An httpGet probe of the sidecar's /upstreamz (the model server's health, asked on loopback). */}}
{{- define "llm-sidecar.upstreamProbe" -}}
{{- $l := .root.Values.modelServer.liveness -}}
httpGet:
  path: /upstreamz
  port: {{ .root.Values.sidecar.adminPort }}
periodSeconds: {{ $l.periodSeconds }}
timeoutSeconds: {{ $l.timeoutSeconds }}
failureThreshold: {{ .failureThreshold }}
{{- end -}}

{{/* An httpGet probe of the sidecar's /stallz (a hung engine), for the model server's liveness
(with several workers, the pod's supervisor answers it from every worker's requests). */}}
{{- define "llm-sidecar.stallProbe" -}}
{{- $p := .Values.modelServer.stallProbe -}}
{{- if .Values.modelServer.liveness.enabled -}}
{{- fail "modelServer.stallProbe and modelServer.liveness are both the model server's liveness probe: enable one" -}}
{{- end -}}
httpGet:
  path: /stallz
  port: {{ .Values.sidecar.adminPort }}
periodSeconds: {{ $p.periodSeconds }}
timeoutSeconds: {{ $p.timeoutSeconds }}
failureThreshold: {{ $p.failureThreshold }}
{{- end -}}

{{/* The sidecar's worker processes: sidecar.workers, else one per core of its CPU request
(rounded up, at least 1: "100m" is 1, "1500m" and "2" are 2). The request, not a limit:
the chart sets no CPU limit (CFS throttling would add latency to what is measured). */}}
{{- define "llm-sidecar.workers" -}}
{{- $s := .Values.sidecar -}}
{{- if $s.workers -}}
{{- $s.workers -}}
{{- else -}}
{{- $cpu := toString (dig "requests" "cpu" "" ($s.resources | default dict)) -}}
{{- $milli := 1000 -}}
{{- if hasSuffix "m" $cpu -}}
{{- $milli = int (trimSuffix "m" $cpu) -}}
{{- else if $cpu -}}
{{- $milli = int (mulf (float64 $cpu) 1000) -}}
{{- end -}}
{{- max 1 (div (add $milli 999) 1000) -}}
{{- end -}}
{{- end -}}

{{/* The sidecar's environment: its settings, OpenTelemetry, and the downward API. */}}
{{- define "llm-sidecar.env" -}}
{{- $s := .Values.sidecar -}}
- name: LLM_SIDECAR_UPSTREAM
  value: {{ include "llm-sidecar.upstream" . | quote }}
- name: LLM_SIDECAR_LISTEN
  value: {{ printf "0.0.0.0:%d" (int $s.port) | quote }}
- name: LLM_SIDECAR_METRICS_LISTEN
  value: {{ printf "0.0.0.0:%d" (int $s.adminPort) | quote }}
- name: LLM_SIDECAR_HEALTH_PATH
  value: {{ $s.healthPath | quote }}
- name: LLM_SIDECAR_DRAIN_SECONDS
  value: {{ include "llm-sidecar.number" $s.drainSeconds | quote }}
- name: LLM_SIDECAR_SLO_TTFT_SECONDS
  value: {{ include "llm-sidecar.number" $s.slo.ttftSeconds | quote }}
- name: LLM_SIDECAR_SLO_TPOT_SECONDS
  value: {{ include "llm-sidecar.number" $s.slo.tpotSeconds | quote }}
- name: LLM_SIDECAR_SLO_E2E_SECONDS
  value: {{ include "llm-sidecar.number" $s.slo.e2eSeconds | quote }}
{{- with $s.modelAllowlist }}
- name: LLM_SIDECAR_MODEL_ALLOWLIST
  value: {{ join "," . | quote }}
{{- end }}
- name: LLM_SIDECAR_MAX_MODELS
  value: {{ include "llm-sidecar.number" $s.maxModels | quote }}
{{- if and (eq .Values.mode "full") .Values.modelServer.stallProbe.enabled }}
- name: LLM_SIDECAR_STALL_PROBE_SECONDS
  value: {{ include "llm-sidecar.number" .Values.modelServer.stallProbe.stallSeconds | quote }}
{{- end }}
- name: LLM_SIDECAR_WORKERS
  value: {{ include "llm-sidecar.workers" . | quote }}
- name: LLM_SIDECAR_LOG_FORMAT
  value: {{ $s.logFormat | quote }}
- name: LLM_SIDECAR_LOG_LEVEL
  value: {{ $s.logLevel | quote }}
{{- range $name, $value := $s.settings }}
- name: {{ printf "LLM_SIDECAR_%s" (upper $name) }}
  {{- if kindIs "slice" $value }}
  value: {{ join "," $value | quote }}
  {{- else if or (kindIs "float64" $value) (kindIs "int64" $value) (kindIs "int" $value) }}
  value: {{ include "llm-sidecar.number" $value | quote }}
  {{- else }}
  value: {{ toString $value | quote }}
  {{- end }}
{{- end }}
{{- with .Values.otel }}
{{- if .endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .endpoint | quote }}
{{- end }}
{{- if .protocol }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ .protocol | quote }}
{{- end }}
{{- if .serviceName }}
- name: OTEL_SERVICE_NAME
  value: {{ .serviceName | quote }}
{{- end }}
{{- if .resourceAttributes }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ $attrs := list }}{{ range $k, $v := .resourceAttributes }}{{ $attrs = append $attrs (printf "%s=%v" $k $v) }}{{ end }}{{ join "," $attrs | quote }}
{{- end }}
{{- if .metrics }}
- name: LLM_SIDECAR_OTEL_METRICS
  value: "true"
{{- end }}
{{- end }}
- name: K8S_POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: K8S_POD_UID
  valueFrom:
    fieldRef:
      fieldPath: metadata.uid
- name: K8S_NAMESPACE_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: K8S_NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: K8S_CONTAINER_NAME
  value: llm-sidecar
{{- if eq .Values.mode "full" }}
- name: K8S_DEPLOYMENT_NAME
  value: {{ include "llm-sidecar.fullname" . | quote }}
{{- end }}
{{- with $s.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
The llm-sidecar container, without restartPolicy (the Deployment adds it for a native
sidecar). Monitoring-only mode prints this same container for users to paste.
*/}}
{{- define "llm-sidecar.container" -}}
{{- $s := .Values.sidecar -}}
name: llm-sidecar
image: {{ printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) | quote }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
{{- if $s.extraArgs }}
args:
  {{- toYaml (concat (list "serve") $s.extraArgs) | nindent 2 }}
{{- else }}
args: [serve]
{{- end }}
ports:
  - name: http
    containerPort: {{ $s.port }}
    protocol: TCP
  - name: metrics
    containerPort: {{ $s.adminPort }}
    protocol: TCP
env:
  {{- include "llm-sidecar.env" . | nindent 2 }}
{{- with $s.startupProbe }}
startupProbe:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $s.livenessProbe }}
livenessProbe:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $s.readinessProbe }}
readinessProbe:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $s.resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $s.securityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $s.volumeMounts }}
volumeMounts:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Values the schema cannot check on its own. */}}
{{- define "llm-sidecar.validate" -}}
{{- if not .Values.image.repository -}}
{{- fail "image.repository is not set: no llm-sidecar image is published; build and push yours first (make image-push REGISTRY=registry.example.com/team) and --set image.repository=registry.example.com/team/llm-sidecar-proxy" -}}
{{- end -}}
{{- if and (eq .Values.mode "monitoring-only") (not .Values.existingServer.podSelector) .Values.prometheus.monitor.enabled -}}
{{- fail "mode monitoring-only: set existingServer.podSelector to the labels of your inference server's pods, so the monitor can find them" -}}
{{- end -}}
{{- if and .Values.prometheus.rules.enabled (not .Values.prometheus.monitor.enabled) -}}
{{- fail "prometheus.rules.enabled needs prometheus.monitor.enabled: the rules judge the series the monitor labels llm_release (or set prometheus.rules.enabled=false)" -}}
{{- end -}}
{{- if and (ne .Values.mode "full") (eq .Values.prometheus.monitor.kind "ServiceMonitor") (without .Values.existingServer.namespaces .Release.Namespace) -}}
{{- fail (printf "existingServer.namespaces needs prometheus.monitor.kind=PodMonitor: a ServiceMonitor's Service selects pods in %s only" .Release.Namespace) -}}
{{- end -}}
{{- if eq (int .Values.sidecar.port) (int .Values.sidecar.adminPort) -}}
{{- fail "sidecar.port and sidecar.adminPort must differ" -}}
{{- end -}}
{{- if and (eq .Values.mode "full") (ge (float64 .Values.modelServer.preStopSeconds) (float64 .Values.sidecar.drainSeconds)) -}}
{{- fail "sidecar.drainSeconds must exceed modelServer.preStopSeconds: the sidecar keeps relaying while the server sleeps in its preStop, and stops at drainSeconds at the latest" -}}
{{- end -}}
{{- if and (eq .Values.mode "full") (eq (int .Values.sidecar.port) (int .Values.modelServer.port)) -}}
{{- fail "sidecar.port and modelServer.port must differ: both listen in the same pod" -}}
{{- end -}}
{{- if eq .Values.mode "full" -}}
{{- $taken := list "llm-sidecar" .Values.modelServer.name -}}
{{- range $which := list "extraInitContainers" "extraContainers" -}}
{{- range $i, $c := index $.Values $which -}}
{{- if has $c.name $taken -}}
{{- fail (printf "%s[%d]: a container named %s is already in the pod" $which $i $c.name) -}}
{{- end -}}
{{- $taken = append $taken $c.name -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with .Values.podDisruptionBudget -}}
{{- if and .enabled (eq $.Values.mode "full") -}}
{{- $min := .minAvailable -}}
{{- $never := false -}}
{{- if not (kindIs "invalid" $min) -}}
{{- $never = or (eq (toString $min) "100%") (and (not (kindIs "string" $min)) (gt (int $min) 0) (ge (int $min) (int $.Values.replicaCount))) -}}
{{- else -}}
{{- $never = or (eq (toString .maxUnavailable) "0") (eq (toString .maxUnavailable) "0%") -}}
{{- end -}}
{{- if $never -}}
{{- fail (printf "podDisruptionBudget allows no eviction (minAvailable %v, maxUnavailable %v, replicaCount %v): a node drain would wait forever; lower it, or podDisruptionBudget.enabled=false" (default "null" $min) .maxUnavailable $.Values.replicaCount) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A Prometheus duration of one unit (90s, 5m, 6h, 3d) -> whole seconds: the rules' burn-rate
windows (prometheus.rules.windows), checked against the canonical form below. */}}
{{- define "llm-sidecar.seconds" -}}
{{- $d := toString . -}}
{{- mul (regexFind "^[0-9]+" $d | atoi) (get (dict "s" 1 "m" 60 "h" 3600 "d" 86400) (regexFind "[smhd]$" $d)) -}}
{{- end -}}

{{/* Whole seconds -> the duration in the largest exact unit up to days, as the rule generator
names windows (sidecar/tools/slo/windows.py format_duration): 3600 -> 1h, 86400 -> 1d. */}}
{{- define "llm-sidecar.duration" -}}
{{- $s := int64 . -}}
{{- if eq (mod $s 86400) 0 }}{{ div $s 86400 }}d{{ else if eq (mod $s 3600) 0 }}{{ div $s 3600 }}h{{ else if eq (mod $s 60) 0 }}{{ div $s 60 }}m{{ else }}{{ $s }}s{{ end -}}
{{- end -}}
