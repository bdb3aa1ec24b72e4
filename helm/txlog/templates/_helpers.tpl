{{/*
Names, labels and the pieces every txlog workload shares.
*/}}

{{- define "txlog.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's full name. Kept to 40 characters: StatefulSet pods add
"-partition-svc-N" and their names must stay DNS labels (63).
*/}}
{{- define "txlog.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "txlog.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "txlog.labels" -}}
helm.sh/chart: {{ include "txlog.chart" . }}
app.kubernetes.io/name: {{ include "txlog.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: txlog
{{- end }}

{{/* Selector labels of one component: (dict "root" $ "component" "partition-svc") */}}
{{- define "txlog.selectorLabels" -}}
app.kubernetes.io/name: {{ include "txlog.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "txlog.componentLabels" -}}
{{ include "txlog.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
Labels of a txlog service's pods: (dict "root" $ "component" "partition-svc").
With metrics on, txlog-metrics: "true", which the metrics Service and the
PodMonitor select (and no other pod of the release carries).
*/}}
{{- define "txlog.servicePodLabels" -}}
{{ include "txlog.componentLabels" . }}
{{- if .root.Values.metrics.enabled }}
{{ include "txlog.metricsPodLabels" .root }}
{{- end }}
{{- end }}

{{/* What the metrics Service and the PodMonitor select: the release's txlog service pods. */}}
{{- define "txlog.metricsPodLabels" -}}
app.kubernetes.io/name: {{ include "txlog.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
txlog-metrics: "true"
{{- end }}

{{/*
The release's labels and more of the operator's: (dict "root" $ "labels" MAP
"component" NAME-or-empty); the chart's own win over a given one of the same name.
*/}}
{{- define "txlog.labelsWith" -}}
{{- $own := include "txlog.labels" .root | fromYaml }}
{{- with .component }}
{{- $_ := set $own "app.kubernetes.io/component" . }}
{{- end }}
{{- toYaml (merge $own (deepCopy (default dict .labels))) }}
{{- end }}

{{/*
The label selector of every alert and its series: what the chart's
ServiceMonitor and PodMonitor give the series they scrape.
*/}}
{{- define "txlog.metricsSeries" -}}
namespace="{{ .Release.Namespace }}",job="{{ include "txlog.fullname" . }}"
{{- end }}

{{/*
The scrape relabelings the ServiceMonitor and the PodMonitor share: job is
the release's full name whichever scrapes (the alert rules select it).
*/}}
{{- define "txlog.metricsRelabelings" -}}
- action: replace
  targetLabel: job
  replacement: {{ include "txlog.fullname" . }}
{{- end }}

{{/* The container ports of a txlog service: (dict "root" $ "port" 7300). */}}
{{- define "txlog.servicePorts" -}}
- name: grpc
  containerPort: {{ .port }}
  protocol: TCP
{{- if .root.Values.tls.enabled }}
- name: health
  containerPort: {{ .root.Values.tls.healthPort }}
  protocol: TCP
{{- end }}
{{- if .root.Values.metrics.enabled }}
- name: metrics
  containerPort: {{ .root.Values.metrics.port }}
  protocol: TCP
{{- end }}
{{- end }}

{{- define "txlog.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "txlog.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "txlog.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "txlog.sparkImage" -}}
{{- printf "%s:%s" .Values.sparkJob.image.repository (default .Chart.AppVersion .Values.sparkJob.image.tag) }}
{{- end }}

{{/* The headless Service of a component: (dict "root" $ "component" "partition-svc") */}}
{{- define "txlog.headlessName" -}}
{{- printf "%s-%s-headless" (include "txlog.fullname" .root) .component }}
{{- end }}

{{- define "txlog.zookeeperName" -}}
{{- printf "%s-zookeeper" (include "txlog.fullname" .) }}
{{- end }}

{{/* The ZooKeeper connection string the services use. */}}
{{- define "txlog.zookeeperConnect" -}}
{{- if .Values.zookeeper.enabled }}
{{- printf "%s.%s.svc.%s:2181" (include "txlog.zookeeperName" .) .Release.Namespace .Values.clusterDomain }}
{{- else }}
{{- required "zookeeper.external is required when zookeeper.enabled is false (host:port[,host:port...])" .Values.zookeeper.external }}
{{- end }}
{{- end }}

{{/*
The stable DNS name of every partition_svc pod with its port, comma-separated:
the `bootstrap` clients and jobs start from.
*/}}
{{- define "txlog.bootstrap" -}}
{{- $name := printf "%s-partition-svc" (include "txlog.fullname" .) }}
{{- $headless := include "txlog.headlessName" (dict "root" . "component" "partition-svc") }}
{{- $addresses := list }}
{{- range $ordinal := until (int .Values.partitionSvc.replicas) }}
{{- $addresses = append $addresses (printf "%s-%d.%s.%s.svc.%s:%d" $name $ordinal $headless $.Release.Namespace $.Values.clusterDomain (int $.Values.partitionSvc.port)) }}
{{- end }}
{{- join "," $addresses }}
{{- end }}

{{/* Environment every service shares (ZooKeeper, logs, traces, shutdown, the pod's identity). */}}
{{- define "txlog.commonEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: TXLOG_ZOOKEEPER
  value: {{ include "txlog.zookeeperConnect" . | quote }}
- name: TXLOG_ZOOKEEPER_ROOT
  value: {{ .Values.zookeeper.root | quote }}
- name: TXLOG_ZOOKEEPER_SESSION_TIMEOUT_S
  value: {{ .Values.zookeeper.sessionTimeoutSeconds | quote }}
- name: TXLOG_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: TXLOG_OTEL_EXPORTER
  value: {{ .Values.telemetry.exporter | quote }}
- name: TXLOG_OTEL_ENDPOINT
  value: {{ .Values.telemetry.endpoint | quote }}
- name: TXLOG_SHUTDOWN_GRACE_S
  value: {{ .Values.shutdownGraceSeconds | quote }}
{{- if .Values.metrics.enabled }}
- name: TXLOG_METRICS_LISTEN
  value: "0.0.0.0:{{ .Values.metrics.port }}"
{{- end }}
{{- if .Values.zookeeper.auth.enabled }}
- name: TXLOG_ZOOKEEPER_AUTH_FILE
  value: /etc/txlog/zookeeper/identity
{{- end }}
{{- if .Values.tls.enabled }}
{{ include "txlog.tlsEnv" . }}
- name: TXLOG_TLS_CLIENT_AUTH
  value: {{ .Values.tls.clientAuth | quote }}
- name: TXLOG_HEALTH_LISTEN
  value: "0.0.0.0:{{ .Values.tls.healthPort }}"
{{- if .Values.authorizer.enabled }}
- name: TXLOG_AUTHORIZER
  value: acl
- name: TXLOG_SUPER_USERS
  value: {{ include "txlog.superUsers" . | quote }}
- name: TXLOG_PRINCIPAL_MAPPING_RULES
  value: {{ .Values.authorizer.principalMappingRules | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* The principal of the services' certificate (a super user: calls between services need ClusterAction). */}}
{{- define "txlog.servicesPrincipal" -}}
{{- default (printf "User:%s-services" (include "txlog.fullname" .)) .Values.authorizer.servicesPrincipal }}
{{- end }}

{{/* The principal of the Spark job's certificate. */}}
{{- define "txlog.sparkJobPrincipal" -}}
{{- default (printf "User:%s-spark-job" (include "txlog.fullname" .)) .Values.authorizer.sparkJobPrincipal }}
{{- end }}

{{/* The principal of the console's certificate. */}}
{{- define "txlog.consolePrincipal" -}}
{{- default (printf "User:%s-console" (include "txlog.fullname" .)) .Values.authorizer.consolePrincipal }}
{{- end }}

{{/* TXLOG_SUPER_USERS: the services' principal, then authorizer.superUsers, ';'-separated. */}}
{{- define "txlog.superUsers" -}}
{{- prepend .Values.authorizer.superUsers (include "txlog.servicesPrincipal" .) | uniq | join ";" }}
{{- end }}

{{/* One word for sh, single-quoted (a quote inside becomes '\''). */}}
{{- define "txlog.shellQuote" -}}
'{{ replace "'" "'\\''" (toString .) }}'
{{- end }}

{{/* TXLOG_TLS_CA / CERT / KEY: the files of the Secret mounted at /etc/txlog/tls. */}}
{{- define "txlog.tlsEnv" -}}
- name: TXLOG_TLS_CA
  value: /etc/txlog/tls/ca.crt
- name: TXLOG_TLS_CERT
  value: /etc/txlog/tls/tls.crt
- name: TXLOG_TLS_KEY
  value: /etc/txlog/tls/tls.key
{{- end }}

{{/* The Secret holding the services' ZooKeeper digest identity. */}}
{{- define "txlog.zookeeperAuthSecret" -}}
{{- default (printf "%s-zookeeper-auth" (include "txlog.fullname" .)) .Values.zookeeper.auth.existingSecret }}
{{- end }}

{{/* Volumes and mounts of the services' secrets (TLS, ZooKeeper identity). */}}
{{- define "txlog.serviceSecretVolumes" -}}
{{- if .Values.tls.enabled }}
{{ include "txlog.tlsVolume" (dict "secret" (include "txlog.servicesTlsSecret" .)) }}
{{- end }}
{{- if .Values.zookeeper.auth.enabled }}
- name: zookeeper-auth
  secret:
    secretName: {{ include "txlog.zookeeperAuthSecret" . }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{- define "txlog.serviceSecretMounts" -}}
{{- if .Values.tls.enabled }}
{{ include "txlog.tlsMount" . }}
{{- end }}
{{- if .Values.zookeeper.auth.enabled }}
- name: zookeeper-auth
  mountPath: /etc/txlog/zookeeper
  readOnly: true
{{- end }}
{{- end }}

{{/* The Secret of the services' certificate. */}}
{{- define "txlog.servicesTlsSecret" -}}
{{- default (printf "%s-services-tls" (include "txlog.fullname" .)) .Values.tls.existingSecret }}
{{- end }}

{{/* The Secret of the Spark job's client certificate. */}}
{{- define "txlog.sparkJobTlsSecret" -}}
{{- if .Values.tls.existingSecret }}{{ .Values.tls.sparkJobSecret }}{{ else }}{{ printf "%s-spark-job-tls" (include "txlog.fullname" .) }}{{ end }}
{{- end }}

{{/* The Secret of the console's client certificate. */}}
{{- define "txlog.consoleTlsSecret" -}}
{{- if .Values.tls.existingSecret }}{{ .Values.tls.consoleSecret }}{{ else }}{{ printf "%s-console-tls" (include "txlog.fullname" .) }}{{ end }}
{{- end }}

{{/* A volume of a certificate Secret: (dict "secret" NAME) */}}
{{- define "txlog.tlsVolume" -}}
- name: tls
  secret:
    secretName: {{ .secret }}
    defaultMode: 0440
{{- end }}

{{- define "txlog.tlsMount" -}}
- name: tls
  mountPath: /etc/txlog/tls
  readOnly: true
{{- end }}

{{/* gRPC health probes on a port: (dict "root" $ "port" 7300); with TLS on the plaintext health port. */}}
{{- define "txlog.probes" -}}
{{- $p := .root.Values.probes -}}
{{- $port := ternary .root.Values.tls.healthPort .port .root.Values.tls.enabled -}}
startupProbe:
  grpc:
    port: {{ $port }}
  periodSeconds: {{ $p.startup.periodSeconds }}
  timeoutSeconds: {{ $p.startup.timeoutSeconds }}
  failureThreshold: {{ $p.startup.failureThreshold }}
readinessProbe:
  grpc:
    port: {{ $port }}
  periodSeconds: {{ $p.readiness.periodSeconds }}
  timeoutSeconds: {{ $p.readiness.timeoutSeconds }}
  failureThreshold: {{ $p.readiness.failureThreshold }}
livenessProbe:
  grpc:
    port: {{ $port }}
  periodSeconds: {{ $p.liveness.periodSeconds }}
  timeoutSeconds: {{ $p.liveness.timeoutSeconds }}
  failureThreshold: {{ $p.liveness.failureThreshold }}
{{- end }}

{{/* Scheduling shared by the pods; without an affinity, a component's pods prefer distinct nodes. */}}
{{- define "txlog.scheduling" -}}
{{- with .root.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .root.Values.affinity }}
affinity:
  {{- toYaml .root.Values.affinity | nindent 2 }}
{{- else }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "txlog.selectorLabels" . | nindent 14 }}
{{- end }}
{{- end }}

{{/* The pod spec lines every txlog service shares. */}}
{{- define "txlog.podCommon" -}}
serviceAccountName: {{ include "txlog.serviceAccountName" .root }}
automountServiceAccountToken: false
terminationGracePeriodSeconds: {{ .root.Values.terminationGracePeriodSeconds }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- include "txlog.scheduling" . }}
{{- end }}

{{/* Refuses values that would render but not work. */}}
{{- define "txlog.validate" -}}
{{- if le (int .Values.terminationGracePeriodSeconds) (int (ceil .Values.shutdownGraceSeconds)) }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must exceed shutdownGraceSeconds (%v): the service needs time after the drain to close RocksDB and its ZooKeeper session" .Values.terminationGracePeriodSeconds .Values.shutdownGraceSeconds) }}
{{- end }}
{{- if and .Values.tls.enabled .Values.tls.existingSecret .Values.sparkJob.enabled (not .Values.tls.sparkJobSecret) }}
{{- fail "tls.sparkJobSecret is required with tls.existingSecret while sparkJob.enabled: the job needs a client certificate" }}
{{- end }}
{{- if and .Values.tls.enabled .Values.tls.existingSecret .Values.console.enabled (not .Values.tls.consoleSecret) }}
{{- fail "tls.consoleSecret is required with tls.existingSecret while console.enabled: the console needs a client certificate" }}
{{- end }}
{{- if and .Values.authorizer.enabled (not .Values.tls.enabled) }}
{{- fail "authorizer.enabled needs tls.enabled: a caller's principal is its client certificate's subject (set authorizer.enabled=false to run without TLS)" }}
{{- end }}
{{- if and .Values.authorizer.enabled .Values.tls.enabled .Values.tls.existingSecret (not .Values.authorizer.servicesPrincipal) }}
{{- fail "authorizer.servicesPrincipal is required with tls.existingSecret: the principal of the services' certificate (User:<its CN>), which must be a super user" }}
{{- end }}
{{- if and .Values.authorizer.enabled .Values.tls.enabled .Values.tls.existingSecret .Values.authorizer.grantSparkJob .Values.sparkJob.enabled (not .Values.authorizer.sparkJobPrincipal) }}
{{- fail "authorizer.sparkJobPrincipal is required with tls.existingSecret while authorizer.grantSparkJob: the principal of tls.sparkJobSecret's certificate (User:<its CN>)" }}
{{- end }}
{{- if and .Values.authorizer.enabled .Values.tls.enabled .Values.tls.existingSecret .Values.authorizer.grantConsole .Values.console.enabled (not .Values.authorizer.consolePrincipal) }}
{{- fail "authorizer.consolePrincipal is required with tls.existingSecret while authorizer.grantConsole: the principal of tls.consoleSecret's certificate (User:<its CN>)" }}
{{- end }}
{{- range $i, $acl := .Values.authorizer.acls }}
{{- if and $acl.cluster $acl.prefixed }}
{{- fail (printf "authorizer.acls[%d]: the Cluster resource cannot be prefixed" $i) }}
{{- end }}
{{- end }}
{{- if and (not .Values.zookeeper.enabled) (not .Values.zookeeper.external) }}
{{- fail "zookeeper.external is required when zookeeper.enabled is false (host:port[,host:port...])" }}
{{- end }}
{{- if and .Values.zookeeper.enabled .Values.zookeeper.external }}
{{- fail "set either zookeeper.enabled or zookeeper.external, not both" }}
{{- end }}
{{- $m := .Values.metrics }}
{{- if and $m.serviceMonitor.enabled $m.podMonitor.enabled }}
{{- fail "enable metrics.serviceMonitor or metrics.podMonitor, not both: each would scrape every pod, and sums would count it twice" }}
{{- end }}
{{- if and (or $m.serviceMonitor.enabled $m.podMonitor.enabled) (not $m.enabled) }}
{{- fail "metrics.serviceMonitor and metrics.podMonitor need metrics.enabled: without it no pod serves /metrics" }}
{{- end }}
{{- if $m.enabled }}
{{- $taken := dict "producerIdSvc.port" .Values.producerIdSvc.port "partitionSvc.port" .Values.partitionSvc.port "coordinatorSvc.port" .Values.coordinatorSvc.port }}
{{- if .Values.tls.enabled }}
{{- $_ := set $taken "tls.healthPort" .Values.tls.healthPort }}
{{- end }}
{{- range $key, $port := $taken }}
{{- if eq (int $port) (int $m.port) }}
{{- fail (printf "metrics.port (%v) is also %s: every port of a pod must differ" $m.port $key) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
