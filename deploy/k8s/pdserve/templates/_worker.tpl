{{/*
A worker tier: Deployment + headless Service (+ PDB and HPA in their own files).
(dict "root" $ "tier" "prefill|decode").

Deployments, not StatefulSets: a worker keeps nothing that must survive it (its KV cache is a
cache; a lost decode worker's streams resume on another one), peers are found by the pod IPs
behind the headless Service, and a decode worker advertises its KV transport at its pod IP
(downward API), so no pod needs a stable name. Deployments roll out in parallel and scale with
an HPA without ordinal bookkeeping.
*/}}
{{- define "pdserve.worker" -}}
{{- $root := .root -}}
{{- $tier := .tier -}}
{{- $v := get $root.Values $tier -}}
{{- $ctx := dict "root" $root "tier" $tier -}}
{{- $port := get $root.Values.ports $tier -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "pdserve.tierName" $ctx }}
  labels:
    {{- include "pdserve.tierLabels" $ctx | nindent 4 }}
spec:
  {{- if not $v.autoscaling.enabled }}
  replicas: {{ $v.replicas }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "pdserve.selectorLabels" $ctx | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "pdserve.tierLabels" $ctx | nindent 8 }}
      annotations:
        checksum/config: {{ include (print $root.Template.BasePath "/configmap.yaml") $root | sha256sum }}
        {{- with $v.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      {{- include "pdserve.podCommon" (dict "root" $root "v" $v) | trim | nindent 6 }}
      {{- if $root.Values.ipc.hostIPC }}
      hostIPC: true
      {{- end }}
      # SIGTERM: health turns NOT_SERVING, new requests are refused, running ones get
      # --drain-seconds; then the process exits.
      terminationGracePeriodSeconds: {{ add (int $v.drainSeconds) 15 }}
      {{- with include "pdserve.initContainers" $root | trim }}{{ . | nindent 6 }}{{ end }}
      containers:
        - name: {{ $tier }}
          image: {{ include "pdserve.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          command: ["pdserve"]
          args:
            - {{ $tier }}
            - --listen=0.0.0.0:{{ $port }}
            {{- if eq $tier "decode" }}
            - --transport-listen=0.0.0.0:{{ $root.Values.ports.transport }}
            - --transport-advertise=$(POD_IP)
            - --local-prefill-tokens={{ $v.localPrefillTokens }}
            - --lease-ms={{ $v.leaseMs }}
            - --max-waiting={{ $v.maxWaiting }}
            {{- if ne $v.speculative.method "none" }}
            - --speculative={{ $v.speculative.method }}
            - --num-speculative-tokens={{ $v.speculative.numTokens }}
            {{- end }}
            {{- end }}
            {{- if ne $root.Values.engine.device "cpu" }}
            - --device={{ $root.Values.engine.device }}
            {{- end }}
            - --metrics-listen=0.0.0.0:{{ $root.Values.ports.metrics }}
            - --drain-seconds={{ $v.drainSeconds }}
            {{- if $root.Values.kvEvents.enabled }}
            - --kv-events-publisher=zmq
            - "--kv-events-endpoint=tcp://*:{{ $root.Values.ports.kvEvents }}"
            - "--kv-events-replay-endpoint=tcp://*:{{ $root.Values.ports.kvEventsReplay }}"
            - --kv-events-topic={{ $root.Values.kvEvents.topic }}
            - --kv-events-buffer-steps={{ $root.Values.kvEvents.bufferSteps }}
            {{- end }}
            {{- with include "pdserve.tlsArgs" $root | trim }}{{ . | nindent 12 }}{{ end }}
            {{- with include "pdserve.kvStoreArgs" $root | trim }}{{ . | nindent 12 }}{{ end }}
            {{- with $v.extraArgs }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          env:
            - name: POD_IP
              valueFrom:
                fieldRef:
                  fieldPath: status.podIP
            {{- include "pdserve.configEnv" $ctx | trim | nindent 12 }}
          ports:
            - name: grpc
              containerPort: {{ $port }}
              protocol: TCP
            {{- if eq $tier "decode" }}
            - name: kv-transport
              containerPort: {{ $root.Values.ports.transport }}
              protocol: TCP
            {{- end }}
            - name: metrics
              containerPort: {{ $root.Values.ports.metrics }}
              protocol: TCP
            {{- if $root.Values.kvEvents.enabled }}
            - name: kv-events
              containerPort: {{ $root.Values.ports.kvEvents }}
              protocol: TCP
            - name: kv-events-rpl
              containerPort: {{ $root.Values.ports.kvEventsReplay }}
              protocol: TCP
            {{- end }}
          {{- /* Loading weights comes before the gRPC port opens: up to 10 minutes. */}}
          {{- include "pdserve.probes" (dict "root" $root "port" $port "startupFailures" 120) | trim | nindent 10 }}
          resources: {{- include "pdserve.resources" $v | nindent 12 }}
          securityContext: {{- include "pdserve.containerSecurityContext" $root | trim | nindent 12 }}
          volumeMounts:
            {{- include "pdserve.volumeMounts" $root | trim | nindent 12 }}
            {{- with include "pdserve.kvStoreVolumeMounts" $root | trim }}{{ . | nindent 12 }}{{ end }}
      volumes:
        {{- include "pdserve.volumes" $root | trim | nindent 8 }}
        {{- with include "pdserve.kvStoreVolumes" $root | trim }}{{ . | nindent 8 }}{{ end }}
---
# Headless: its DNS name lists the ready pods' IPs, which the router resolves (dns:///).
apiVersion: v1
kind: Service
metadata:
  name: {{ include "pdserve.tierName" $ctx }}
  labels:
    {{- include "pdserve.tierLabels" $ctx | nindent 4 }}
    pdserve.io/metrics: "true"
spec:
  clusterIP: None
  selector:
    {{- include "pdserve.selectorLabels" $ctx | nindent 4 }}
  ports:
    - name: grpc
      port: {{ $port }}
      targetPort: grpc
      protocol: TCP
      appProtocol: grpc
    {{- if eq $tier "decode" }}
    - name: kv-transport
      port: {{ $root.Values.ports.transport }}
      targetPort: kv-transport
      protocol: TCP
    {{- end }}
    - name: metrics
      port: {{ $root.Values.ports.metrics }}
      targetPort: metrics
      protocol: TCP
    {{- if $root.Values.kvEvents.enabled }}
    - name: kv-events
      port: {{ $root.Values.ports.kvEvents }}
      targetPort: kv-events
      protocol: TCP
    - name: kv-events-rpl
      port: {{ $root.Values.ports.kvEventsReplay }}
      targetPort: kv-events-rpl
      protocol: TCP
    {{- end }}
{{- end -}}
