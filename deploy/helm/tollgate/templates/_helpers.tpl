{{/* The chart's name. */}}
{{- define "tollgate.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's base name: <release>, or <release>-tollgate when the release name does not hold the chart's. */}}
{{- define "tollgate.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Labels of every resource of component .component (root context in .root). */}}
{{- define "tollgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
{{ include "tollgate.selectorLabels" . }}
{{- end }}

{{/* The labels that select component .component's pods. */}}
{{- define "tollgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tollgate.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "tollgate.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
The NATS connection of a process logging in as user .user: env entries
(TOLLGATE_NATS_URL, NATS_PASSWORD or TOLLGATE_NATS_CREDS, and the inbox
and JetStream API prefixes of a process in an account of its own). A password
reaches the URL through Kubernetes' $(NATS_PASSWORD) expansion, so it is
never in the values or the manifest.
*/}}
{{- define "tollgate.natsEnv" -}}
{{- $auth := .root.Values.nats.auth }}
{{- $urls := list }}
{{- if eq $auth.mode "password" }}
- name: NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $auth.secretName }}
      key: {{ required (printf "nats.auth.keys.%s is required" .user) (index $auth.keys .user) }}
{{- range .root.Values.nats.servers }}
{{- $urls = append $urls (printf "nats://%s:$(NATS_PASSWORD)@%s" $.user .) }}
{{- end }}
{{- else }}
{{- range .root.Values.nats.servers }}
{{- $urls = append $urls (printf "nats://%s" .) }}
{{- end }}
{{- end }}
- name: TOLLGATE_NATS_URL
  value: {{ join "," $urls | quote }}
{{- if and .root.Values.nats.ownAccounts (ne .user "admin") }}
- name: TOLLGATE_INBOX_PREFIX
  value: _INBOX_{{ .user }}
- name: TOLLGATE_JS_API_PREFIX
  value: {{ .root.Values.nats.jsAPIPrefix | quote }}
{{- end }}
{{- if eq $auth.mode "creds" }}
- name: TOLLGATE_NATS_CREDS
  value: /etc/tollgate/nats/{{ .user }}.creds
{{- else if not (has $auth.mode (list "password" "none")) }}
{{- fail (printf "nats.auth.mode %q: want password, creds or none" $auth.mode) }}
{{- end }}
{{- end }}

{{/* The volume mount of user .user's creds file (mode creds only). */}}
{{- define "tollgate.natsVolumeMounts" -}}
{{- if eq .root.Values.nats.auth.mode "creds" }}
- name: nats-creds
  mountPath: /etc/tollgate/nats
  readOnly: true
{{- end }}
{{- end }}

{{/* The volume of user .user's creds file (mode creds only). */}}
{{- define "tollgate.natsVolumes" -}}
{{- $auth := .root.Values.nats.auth }}
{{- if eq $auth.mode "creds" }}
- name: nats-creds
  secret:
    secretName: {{ $auth.secretName }}
    defaultMode: 0440
    items:
      - key: {{ required (printf "nats.auth.keys.%s is required" .user) (index $auth.keys .user) }}
        path: {{ .user }}.creds
{{- end }}
{{- end }}

{{/* What every pod of the chart shares: no Kubernetes API token (none talks to the API), pull secrets, security context, placement. */}}
{{- define "tollgate.podCommon" -}}
automountServiceAccountToken: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Liveness on /healthz and readiness on /readyz at the container's metrics port. */}}
{{- define "tollgate.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  {{- toYaml .Values.probes.liveness | nindent 2 }}
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  {{- toYaml .Values.probes.readiness | nindent 2 }}
{{- end }}

{{/*
The stages, in pipeline order, with each one's stream and durable
consumer (jetstream/topology/consumers.go; the chart's render test checks
them against it).
*/}}
{{- define "tollgate.stageConsumers" -}}
ingest: {stream: TOLLGATE_INBOUND, consumer: ingest}
executor: {stream: TOLLGATE_TURNS, consumer: executor}
approver: {stream: TOLLGATE_DECISIONS, consumer: approver}
redriver: {stream: KV_tollgate_approvals, consumer: redriver}
{{- end }}
