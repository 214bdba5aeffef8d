{{/*
Labels every object carries (the kustomize base sets the same part-of label,
with managed-by: kustomize).
*/}}
{{- define "predictive-scaler.labels" -}}
app.kubernetes.io/part-of: predictive-scaler
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "predictive-scaler.namespace" -}}
{{ .Values.namespace.name }}
{{- end }}

{{- define "predictive-scaler.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Selector labels of one component (controller or retrain). */}}
{{- define "predictive-scaler.selector" -}}
app.kubernetes.io/name: predictive-scaler
app.kubernetes.io/component: {{ . }}
{{- end }}

{{/* The container hardening both workloads use. */}}
{{- define "predictive-scaler.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "predictive-scaler.podSecurity" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Environment both workloads need: a writable HOME and matplotlib dir on /tmp. */}}
{{- define "predictive-scaler.env" -}}
- name: HOME
  value: /tmp
- name: PYTHONDONTWRITEBYTECODE
  value: "1"
- name: MPLCONFIGDIR
  value: /tmp/matplotlib
{{- end }}

{{/* The controller's pod template, shared by the one-replica Deployment and the sharded StatefulSet. */}}
{{- define "predictive-scaler.controllerPod" -}}
metadata:
  labels:
    {{- include "predictive-scaler.selector" "controller" | nindent 4 }}
    app.kubernetes.io/part-of: predictive-scaler
  annotations:
    # Settings are read at start: a changed value restarts the controller.
    checksum/settings: {{ include (print $.Template.BasePath "/configmap.yaml") . | sha256sum }}
spec:
  serviceAccountName: predictive-scaler-controller
  automountServiceAccountToken: true
  {{- with .Values.controller.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- include "predictive-scaler.podSecurity" . | nindent 4 }}
  terminationGracePeriodSeconds: 30
  containers:
    - name: controller
      image: {{ include "predictive-scaler.image" . }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args:
        - controller
        - --metrics-port=8080
        - --health-port=8081
        - --prometheus-url=$(PREDICTIVE_SCALER_PROMETHEUS_URL)
        - --model-store=$(PREDICTIVE_SCALER_MODEL_STORE)
        - --interval=$(PREDICTIVE_SCALER_RECONCILE_INTERVAL_SECONDS)
      envFrom:
        - configMapRef:
            name: predictive-scaler-settings
      env:
        {{- include "predictive-scaler.env" . | nindent 8 }}
        {{- if gt (int .Values.sharding.replicas) 1 }}
        # Shard index: the ordinal ending $HOSTNAME (the pod name); count: the replicas.
        - name: PREDICTIVE_SCALER_SHARD_COUNT
          value: {{ .Values.sharding.replicas | quote }}
        - name: POD_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        {{- end }}
      ports:
        - name: metrics
          containerPort: 8080
          protocol: TCP
        - name: health
          containerPort: 8081
          protocol: TCP
        {{- if .Values.keda.enabled }}
        - name: keda
          containerPort: {{ .Values.keda.port }}
          protocol: TCP
        {{- end }}
      livenessProbe:
        httpGet:
          path: /healthz
          port: health
        initialDelaySeconds: 15
        periodSeconds: 20
        timeoutSeconds: 5
        failureThreshold: 3
      readinessProbe:
        httpGet:
          path: /readyz
          port: health
        initialDelaySeconds: 5
        periodSeconds: 10
        timeoutSeconds: 5
        failureThreshold: 3
      resources:
        {{- toYaml .Values.controller.resources | nindent 8 }}
      securityContext:
        {{- include "predictive-scaler.containerSecurity" . | nindent 8 }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
        - name: models
          mountPath: /var/lib/predictive-scaler/models
          readOnly: true
  volumes:
    - name: tmp
      emptyDir:
        sizeLimit: 256Mi
    - name: models
      persistentVolumeClaim:
        claimName: predictive-scaler-models
{{- end }}

{{/*
The Prometheus endpoint the NetworkPolicy lets the workloads reach, read from
prometheus.url: its port (explicit, else the scheme's), and whether its host is a
cluster Service name (name, name.ns, name.ns.svc, name.ns.svc.cluster.local) —
then the namespace it names must be prometheus.namespace — or an address outside,
which only prometheus.externalCIDRs can admit.
*/}}
{{- define "predictive-scaler.prometheusPort" -}}
{{- $u := urlParse .Values.prometheus.url -}}
{{- $port := regexFind ":[0-9]+$" $u.host | trimPrefix ":" -}}
{{- if $port }}{{ $port }}{{ else if eq $u.scheme "https" }}443{{ else }}80{{ end -}}
{{- end }}

{{- define "predictive-scaler.prometheusInCluster" -}}
{{- $u := urlParse .Values.prometheus.url -}}
{{- $host := regexReplaceAll ":[0-9]+$" $u.host "" | lower -}}
{{- $host = regexReplaceAll "^.*@" $host "" -}}
{{- if regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)?(\\.svc(\\.cluster\\.local)?)?$" $host -}}
{{- $parts := splitList "." $host -}}
{{- if and (gt (len $parts) 1) (ne (index $parts 1) .Values.prometheus.namespace) -}}
{{- fail (printf "prometheus.url names the Service %s in namespace %q, but prometheus.namespace is %q: set prometheus.namespace to %q so the NetworkPolicy allows egress there" (index $parts 0) (index $parts 1) .Values.prometheus.namespace (index $parts 1)) -}}
{{- end -}}
true
{{- else if not .Values.prometheus.externalCIDRs -}}
{{- fail (printf "prometheus.url's host %q is not a Service of this cluster: set prometheus.externalCIDRs to the addresses it answers from (the NetworkPolicy allows egress to those alone, on port %s)" $host (include "predictive-scaler.prometheusPort" .)) -}}
{{- end -}}
{{- end }}
