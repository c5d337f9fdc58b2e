{{/* The chart's name: app.kubernetes.io/name, as the kustomize base labels its objects. */}}
{{- define "gpu-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Object names: the release name, or <release>-<chart> when it does not contain the chart's. */}}
{{- define "gpu-exporter.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Selector labels: the kustomize base's, and the release's. */}}
{{- define "gpu-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Every object's labels. */}}
{{- define "gpu-exporter.labels" -}}
{{ include "gpu-exporter.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The container image: repository:tag, or repository@digest. */}}
{{- define "gpu-exporter.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* Whether a web config is served (TLS, basic auth, or one of the user's). */}}
{{- define "gpu-exporter.webConfig" -}}
{{- if or .Values.tlsServerConfig.enabled .Values.webConfig .Values.basicAuth.users }}true{{ end }}
{{- end }}

{{/* Whether /metrics is served over TLS (probes and the ServiceMonitor switch to HTTPS). */}}
{{- define "gpu-exporter.https" -}}
{{- if or .Values.tlsServerConfig.enabled (hasKey .Values.webConfig "tls_server_config") }}true{{ end }}
{{- end }}

{{/* basicAuth.users as the web config wants them: bcrypt hashes; a clear password is hashed. */}}
{{- define "gpu-exporter.basicAuthUsers" -}}
{{- $users := dict }}
{{- range $user, $secret := .Values.basicAuth.users }}
{{- if hasPrefix "$2" $secret }}
{{- $_ := set $users $user $secret }}
{{- else }}
{{- $_ := set $users $user (htpasswd $user $secret | trimPrefix (printf "%s:" $user)) }}
{{- end }}
{{- end }}
{{- toYaml $users }}
{{- end }}

{{/* The web config's YAML: the user's, or the tls component's file; basic auth users added. */}}
{{- define "gpu-exporter.webConfigYaml" -}}
{{- if or .Values.webConfig .Values.basicAuth.users }}
{{- $config := deepCopy (default dict .Values.webConfig) }}
{{- if and (not .Values.webConfig) .Values.tlsServerConfig.enabled }}
{{- $config = .Files.Get "files/web-config.yaml" | fromYaml }}
{{- end }}
{{- if .Values.basicAuth.users }}
{{- $_ := set $config "basic_auth_users" (include "gpu-exporter.basicAuthUsers" . | fromYaml) }}
{{- end }}
{{- toYaml $config }}
{{- else }}
{{- .Files.Get "files/web-config.yaml" }}
{{- end }}
{{- end }}

{{/* The container's resources: the values', or the measured defaults. */}}
{{- define "gpu-exporter.resources" -}}
{{- if .Values.resources }}
{{- toYaml .Values.resources }}
{{- else }}
requests:
  cpu: 50m
  memory: {{ ternary "128Mi" "96Mi" .Values.dra.enabled }}
limits:
  cpu: 200m
  memory: {{ ternary "192Mi" "144Mi" .Values.dra.enabled }}
{{- end }}
{{- end }}
