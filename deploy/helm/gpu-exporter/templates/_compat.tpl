{{/*
Values written for NVIDIA's dcgm-exporter chart that mean nothing here, or something else:
one message naming the key and what to use instead (docs/deploy.md, "Coming from
dcgm-exporter's chart"). Keys with the same meaning (image, arguments, extraEnv,
serviceMonitor, kubeletPath, tolerations, securityContext, podSecurityContext,
tlsServerConfig, basicAuth, priorityClassName) work as they are.
*/}}
{{- define "gpu-exporter.compat" -}}
{{- $instead := dict
  "hostNetwork" "not needed: Prometheus scrapes the pod's own IP"
  "mapPodsMetrics" "use kubernetes (true by default)"
  "service" "the Service is headless on port 9400; use arguments [\"-a\", \":PORT\"] for another container port"
  "serviceAccount" "not needed: the chart makes its ServiceAccount, with the RBAC it needs"
  "customMetrics" "use metricsCsv (the CSV's text)"
  "affinity" "use nodeSelector, gke.enabled or aks.enabled (the chart selects GPU nodes itself)"
  "extraHostVolumes" "use sharedGpus.enabled or gke.enabled (the host paths the exporter reads)"
  "extraConfigMapVolumes" "use metricsCsv or configFile"
  "extraVolumeMounts" "use metricsCsv or configFile"
  "rollingUpdate" "not needed: one node in ten at a time, no surge"
  "kubernetesDRA" "use dra.enabled"
}}
{{- range $key := keys $instead | sortAlpha }}
{{- if hasKey $.Values $key }}
{{- fail (printf "value %q is dcgm-exporter's chart's: %s (docs/deploy.md, Coming from dcgm-exporter's chart)" $key (get $instead $key)) }}
{{- end }}
{{- end }}
{{- if and .Values.basicAuth.users (not (or .Values.tlsServerConfig.enabled .Values.webConfig)) }}
{{- fail "value \"basicAuth.users\" sends passwords in clear text without TLS: set tlsServerConfig.enabled (or webConfig with tls_server_config)" }}
{{- end }}
{{- end }}
