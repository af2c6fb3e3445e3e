{{/* Names, labels and the pieces every tier's pod shares. */}}

{{- define "pdserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pdserve.fullname" -}}
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

{{/* The name of one tier's objects: "<fullname>-router", "-prefill", "-decode". */}}
{{- define "pdserve.tierName" -}}
{{- printf "%s-%s" (include "pdserve.fullname" .root) .tier | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pdserve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "pdserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pdserve
{{- end -}}

{{/* Selector labels of one tier (dict "root" $ "tier" "router|prefill|decode"). */}}
{{- define "pdserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pdserve.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .tier }}
{{- end -}}

{{- define "pdserve.tierLabels" -}}
{{ include "pdserve.labels" .root }}
app.kubernetes.io/component: {{ .tier }}
{{- end -}}

{{- define "pdserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "pdserve.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "pdserve.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* dns:///<headless service>.<namespace>.svc.cluster.local:<port>, how the router finds a tier. */}}
{{- define "pdserve.discovery" -}}
{{- printf "dns:///%s.%s.svc.cluster.local:%v" (include "pdserve.tierName" .) .root.Release.Namespace (get .root.Values.ports .tier) -}}
{{- end -}}

{{/* Flags for TLS and mutual TLS (the Secret is mounted at /etc/pdserve/tls). */}}
{{- define "pdserve.tlsArgs" -}}
{{- if .Values.tls.enabled }}
- --tls-cert=/etc/pdserve/tls/tls.crt
- --tls-key=/etc/pdserve/tls/tls.key
{{- if .Values.tls.mutual }}
- --tls-ca=/etc/pdserve/tls/ca.crt
{{- end }}
{{- end }}
{{- end -}}

{{/* The shared settings a tier reads from the ConfigMap, as PDSERVE_<FLAG> variables. Only the
     flags the tier's command has (`pdserve <tier> --help` lists each one's variable). */}}
{{- define "pdserve.configEnv" -}}
{{- $cm := printf "%s-config" (include "pdserve.fullname" .root) -}}
{{- $keys := list "MODEL" "BLOCK_SIZE" "METRICS_COMPAT" -}}
{{- if eq .tier "router" -}}
{{- $keys = concat $keys (list "POLICY" "KV_DTYPE") -}}
{{- else -}}
{{- $keys = concat $keys (list "KV_DTYPE" "TRANSPORT" "THREADS" "KV_MEMORY_GIB" "MAX_MODEL_LEN" "MAX_NUM_SEQS" "MAX_NUM_BATCHED_TOKENS" "ENABLE_PREFIX_CACHING" "PREFILL_GEMM" "COMPUTE_DTYPE") -}}
{{- end -}}
{{- $keys = concat $keys (list "LOG_LEVEL") -}}
{{- range $keys }}
- name: PDSERVE_{{ . }}
  valueFrom:
    configMapKeyRef:
      name: {{ $cm }}
      key: PDSERVE_{{ . }}
{{- end }}
{{- with .root.Values.tracing }}
{{- if .otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
  value: {{ .otlpEndpoint | quote }}
- name: OTEL_TRACES_SAMPLER
  value: parentbased_traceidratio
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ .sampleRatio | quote }}
- name: OTEL_SERVICE_NAME
  value: {{ .serviceName | quote }}
{{- end }}
{{- end }}
{{- with .root.Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "pdserve.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
  {{- if .Values.ipc.ipcLock }}
  add: ["IPC_LOCK"]
  {{- end }}
{{- end -}}

{{/* Probes through the gRPC health service. Kubelet's gRPC probe speaks plaintext only, so
     with TLS on the port the probes fall back to a TCP connect. (dict "root" $ "port" N). */}}
{{- define "pdserve.probeAction" -}}
{{- if .root.Values.tls.enabled }}
tcpSocket:
  port: {{ .port }}
{{- else }}
grpc:
  port: {{ .port }}
{{- end }}
{{- end -}}

{{- define "pdserve.probes" -}}
startupProbe:
  {{- include "pdserve.probeAction" . | trim | nindent 2 }}
  periodSeconds: 5
  failureThreshold: {{ .startupFailures }}
readinessProbe:
  {{- include "pdserve.probeAction" . | trim | nindent 2 }}
  periodSeconds: 5
  failureThreshold: 2
livenessProbe:
  {{- include "pdserve.probeAction" . | trim | nindent 2 }}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 6
{{- end -}}

{{- define "pdserve.volumeMounts" -}}
{{- if ne .Values.model.source "image" }}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
{{- end }}
- name: tmp
  mountPath: /tmp
{{- if .Values.ipc.shm.enabled }}
- name: shm
  mountPath: /dev/shm
{{- end }}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: /etc/pdserve/tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "pdserve.volumes" -}}
{{- $m := .Values.model -}}
{{- if eq $m.source "pvc" }}
- name: model
  persistentVolumeClaim:
    claimName: {{ $m.pvc.claimName }}
    readOnly: true
{{- else if eq $m.source "hostPath" }}
- name: model
  hostPath:
    path: {{ $m.hostPath.path }}
    type: Directory
{{- else if eq $m.source "download" }}
- name: model
  emptyDir:
    sizeLimit: {{ $m.download.sizeLimit }}
{{- end }}
{{- /* image: the model directory is part of the image; no volume. */}}
- name: tmp
  emptyDir:
    sizeLimit: 1Gi
{{- if .Values.ipc.shm.enabled }}
- name: shm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.ipc.shm.sizeLimit }}
{{- end }}
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ .Values.tls.secretName }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{/* The init container that copies the model from a bucket (model.source: download). */}}
{{- define "pdserve.initContainers" -}}
{{- if eq .Values.model.source "download" }}
initContainers:
  - name: fetch-model
    image: {{ .Values.model.download.image }}
    command: {{- toYaml .Values.model.download.command | nindent 6 }}
    volumeMounts:
      - name: model
        mountPath: {{ .Values.model.mountPath }}
      - name: tmp
        mountPath: /tmp
    resources: {{- toYaml .Values.model.download.resources | nindent 6 }}
    securityContext:
      allowPrivilegeEscalation: false
      runAsNonRoot: true
      capabilities:
        drop: ["ALL"]
{{- end }}
{{- end -}}

{{/* GPUs and RDMA devices of a tier (its values). */}}
{{- define "pdserve.resources" -}}
{{- $r := deepCopy (default dict .resources) -}}
{{- if or (gt (int .gpus) 0) .rdma.resourceName -}}
{{- $limits := default dict (get $r "limits") -}}
{{- if gt (int .gpus) 0 -}}{{- $_ := set $limits "nvidia.com/gpu" (int .gpus) -}}{{- end -}}
{{- if .rdma.resourceName -}}{{- $_ := set $limits .rdma.resourceName (int .rdma.count) -}}{{- end -}}
{{- $_ := set $r "limits" $limits -}}
{{- end -}}
{{- toYaml $r -}}
{{- end -}}

{{/* Scheduling and pod-level settings shared by the three tiers (dict "root" $ "v" tierValues). */}}
{{- define "pdserve.podCommon" -}}
serviceAccountName: {{ include "pdserve.serviceAccountName" .root }}
automountServiceAccountToken: false
securityContext: {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .v.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .v.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .v.affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The shared KV store (kvStore): the workers' flags, and the Secrets they read as files. */}}
{{- define "pdserve.kvStoreUrl" -}}
{{- $k := .Values.kvStore -}}
{{- if eq $k.mode "deploy" -}}
redis://{{ include "pdserve.fullname" . }}-kv-store:{{ $k.redis.port }}
{{- else -}}
{{ if $k.tlsSecret }}rediss{{ else }}redis{{ end }}{{ if $k.cluster }}+cluster{{ end }}://{{ join "," $k.servers }}
{{- end -}}
{{- end -}}

{{- define "pdserve.kvStoreArgs" -}}
{{- $k := .Values.kvStore -}}
{{- if $k.enabled }}
- --kv-store={{ include "pdserve.kvStoreUrl" . }}
- --kv-store-timeout-ms={{ $k.timeoutMs }}
{{- if $k.passwordSecret }}
- --kv-store-password-file=/etc/pdserve/kv-store-password/password
{{- end }}
{{- if $k.keySecret }}
- --kv-store-key-file=/etc/pdserve/kv-store-key/key
{{- end }}
{{- if and (eq $k.mode "external") $k.tlsSecret }}
- --kv-store-tls-ca=/etc/pdserve/kv-store-tls/ca.crt
{{- if $k.clientCertificate }}
- --kv-store-tls-cert=/etc/pdserve/kv-store-tls/tls.crt
- --kv-store-tls-key=/etc/pdserve/kv-store-tls/tls.key
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "pdserve.kvStoreVolumeMounts" -}}
{{- $k := .Values.kvStore -}}
{{- if and $k.enabled $k.passwordSecret }}
- name: kv-store-password
  mountPath: /etc/pdserve/kv-store-password
  readOnly: true
{{- end }}
{{- if and $k.enabled $k.keySecret }}
- name: kv-store-key
  mountPath: /etc/pdserve/kv-store-key
  readOnly: true
{{- end }}
{{- if and $k.enabled (eq $k.mode "external") $k.tlsSecret }}
- name: kv-store-tls
  mountPath: /etc/pdserve/kv-store-tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "pdserve.kvStoreVolumes" -}}
{{- $k := .Values.kvStore -}}
{{- if and $k.enabled $k.passwordSecret }}
- name: kv-store-password
  secret:
    secretName: {{ $k.passwordSecret }}
    items: [{key: password, path: password}]
    defaultMode: 0440
{{- end }}
{{- if and $k.enabled $k.keySecret }}
- name: kv-store-key
  secret:
    secretName: {{ $k.keySecret }}
    items: [{key: key, path: key}]
    defaultMode: 0440
{{- end }}
{{- if and $k.enabled (eq $k.mode "external") $k.tlsSecret }}
- name: kv-store-tls
  secret:
    secretName: {{ $k.tlsSecret }}
    defaultMode: 0440
{{- end }}
{{- end -}}
