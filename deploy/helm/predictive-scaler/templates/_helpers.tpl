{{/*
Names. fullname (the release name, or <release>-<chart name>, or fullnameOverride)
prefixes every object; cut to 41 characters so that the longest derived name
(<fullname>-controller-shards, a Service) stays a DNS label and the StatefulSet's
and CronJob's names leave room for the suffixes Kubernetes adds to them.
*/}}
{{- define "predictive-scaler.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "predictive-scaler.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 41 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 41 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 41 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Where the namespaced objects live: namespace.name, else the release namespace. */}}
{{- define "predictive-scaler.namespace" -}}
{{- .Values.namespace.name | default .Release.Namespace }}
{{- end }}

{{/* The ServiceAccount of a component: (list $ "controller"|"retrain"). */}}
{{- define "predictive-scaler.serviceAccountName" -}}
{{- $root := index . 0 }}
{{- $who := index . 1 }}
{{- (index $root.Values.serviceAccount $who).name | default (printf "%s-%s" (include "predictive-scaler.fullname" $root) $who) }}
{{- end }}

{{/*
Labels every object carries (the kustomize base sets the same part-of label,
with managed-by: kustomize).
*/}}
{{- define "predictive-scaler.labels" -}}
app.kubernetes.io/part-of: predictive-scaler
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "predictive-scaler.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Selector labels of one component: (list $ "controller"|"retrain"|…). */}}
{{- define "predictive-scaler.selector" -}}
app.kubernetes.io/name: {{ include "predictive-scaler.name" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/*
A pod template's metadata: (list $ "controller"|"retrain" <annotations the chart sets>).
The component's podLabels and podAnnotations are added; the chart's own win on a clash.
*/}}
{{- define "predictive-scaler.podMetadata" -}}
{{- $root := index . 0 }}
{{- $who := index . 1 }}
{{- $values := index $root.Values $who }}
{{- $labels := include "predictive-scaler.selector" (list $root $who) | fromYaml }}
{{- $_ := set $labels "app.kubernetes.io/part-of" "predictive-scaler" }}
{{- if and (eq $who "controller") (eq (include "predictive-scaler.kedaHighAvailability" $root) "true") }}
{{- $labels = merge $labels (include "predictive-scaler.kedaServerLabel" $root | fromYaml) }}
{{- end }}
{{- $annotations := merge (index . 2) (deepCopy ($values.podAnnotations | default dict)) -}}
labels:
  {{- toYaml (merge $labels (deepCopy ($values.podLabels | default dict))) | nindent 2 }}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Pod-spec fields a component takes from its values (controller.* or retrain.*):
(list $ "controller"|"retrain"). Affinity is the caller's: the retraining pod adds its own.
*/}}
{{- define "predictive-scaler.podPlacement" -}}
{{- $root := index . 0 }}
{{- $who := index . 1 }}
{{- $values := index $root.Values $who -}}
serviceAccountName: {{ include "predictive-scaler.serviceAccountName" (list $root $who) }}
automountServiceAccountToken: true
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with $values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- range . }}
  {{- $constraint := deepCopy . }}
  {{- if not (hasKey $constraint "labelSelector") }}
  {{- $_ := set $constraint "labelSelector" (dict "matchLabels" (include "predictive-scaler.selector" (list $root $who) | fromYaml)) }}
  {{- end }}
  - {{- toYaml $constraint | nindent 4 }}
  {{- end }}
{{- end }}
{{- with $values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
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
{{- $fullname := include "predictive-scaler.fullname" . }}
{{- $values := .Values.controller -}}
metadata:
  {{- /* Settings are read at start: a changed value restarts the controller. */}}
  {{- $checksum := dict "checksum/settings" (include (print $.Template.BasePath "/configmap.yaml") . | sha256sum) }}
  {{- include "predictive-scaler.podMetadata" (list . "controller" $checksum) | nindent 2 }}
spec:
  {{- include "predictive-scaler.podPlacement" (list . "controller") | nindent 2 }}
  {{- with $values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
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
        {{- range $values.extraArgs }}
        - {{ . | quote }}
        {{- end }}
      envFrom:
        - configMapRef:
            name: {{ $fullname }}-settings
        {{- with $values.envFrom }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      env:
        {{- include "predictive-scaler.env" . | nindent 8 }}
        {{- include "predictive-scaler.prometheusAuthEnv" . | nindent 8 }}
        {{- if gt (int .Values.sharding.replicas) 1 }}
        # Shard index: the ordinal ending $HOSTNAME (the pod name); count: the replicas.
        - name: PREDICTIVE_SCALER_SHARD_COUNT
          value: {{ .Values.sharding.replicas | quote }}
        - name: POD_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        {{- end }}
        {{- include "predictive-scaler.kedaTlsEnv" . | nindent 8 }}
        {{- with $values.env }}
        {{- toYaml . | nindent 8 }}
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
        {{- toYaml $values.resources | nindent 8 }}
      {{- with $values.securityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
        - name: models
          mountPath: /var/lib/predictive-scaler/models
          readOnly: true
        {{- include "predictive-scaler.prometheusAuthMounts" . | nindent 8 }}
        {{- include "predictive-scaler.kedaTlsMount" . | nindent 8 }}
        {{- with $values.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    - name: tmp
      emptyDir:
        sizeLimit: 256Mi
    - name: models
      persistentVolumeClaim:
        claimName: {{ $fullname }}-models
    {{- include "predictive-scaler.prometheusAuthVolumes" . | nindent 4 }}
    {{- include "predictive-scaler.kedaTlsVolume" . | nindent 4 }}
    {{- with $values.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
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

{{/*
Prometheus authentication (prometheus.auth): the environment variables that set the
--prometheus-* flags' defaults, and the Secrets mounted read-only for them. Secrets
are files, never values in the pod spec; the kubelet updates a mounted Secret in
place and the process re-reads the token or password when its file changes.
*/}}
{{- define "predictive-scaler.prometheusAuthEnv" -}}
{{- $a := .Values.prometheus.auth -}}
{{- if $a.bearerTokenSecret.name }}
- name: PREDICTIVE_SCALER_PROMETHEUS_BEARER_TOKEN_FILE
  value: /var/run/secrets/prometheus/bearer/{{ $a.bearerTokenSecret.key }}
{{- end }}
{{- if $a.basicAuthSecret.name }}
- name: PREDICTIVE_SCALER_PROMETHEUS_BASIC_AUTH_USER
  valueFrom:
    secretKeyRef:
      name: {{ $a.basicAuthSecret.name }}
      key: {{ $a.basicAuthSecret.usernameKey }}
- name: PREDICTIVE_SCALER_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE
  value: /var/run/secrets/prometheus/basic-auth/{{ $a.basicAuthSecret.passwordKey }}
{{- end }}
{{- if $a.tlsSecret.name }}
{{- if $a.tlsSecret.caKey }}
- name: PREDICTIVE_SCALER_PROMETHEUS_CA_FILE
  value: /var/run/secrets/prometheus/tls/{{ $a.tlsSecret.caKey }}
{{- end }}
{{- if and $a.tlsSecret.certKey $a.tlsSecret.keyKey }}
- name: PREDICTIVE_SCALER_PROMETHEUS_CERT_FILE
  value: /var/run/secrets/prometheus/tls/{{ $a.tlsSecret.certKey }}
- name: PREDICTIVE_SCALER_PROMETHEUS_KEY_FILE
  value: /var/run/secrets/prometheus/tls/{{ $a.tlsSecret.keyKey }}
{{- else if or $a.tlsSecret.certKey $a.tlsSecret.keyKey }}
{{- fail "prometheus.auth.tlsSecret: a client certificate needs both certKey and keyKey" }}
{{- end }}
{{- end }}
{{- if $a.insecureSkipVerify }}
- name: PREDICTIVE_SCALER_PROMETHEUS_INSECURE_SKIP_VERIFY
  value: "true"
{{- end }}
{{- with $a.headers }}
- name: PREDICTIVE_SCALER_PROMETHEUS_HEADERS
  value: {{ range $i, $name := keys . | sortAlpha }}{{ if $i }},{{ end }}{{ $name }}={{ index $a.headers $name }}{{ end }}
{{- end }}
{{- end }}

{{- define "predictive-scaler.prometheusAuthMounts" -}}
{{- $a := .Values.prometheus.auth -}}
{{- range $dir, $secret := dict "bearer" $a.bearerTokenSecret "basic-auth" $a.basicAuthSecret "tls" $a.tlsSecret }}
{{- if $secret.name }}
- name: prometheus-{{ $dir }}
  mountPath: /var/run/secrets/prometheus/{{ $dir }}
  readOnly: true
{{- end }}
{{- end }}
{{- end }}

{{- define "predictive-scaler.prometheusAuthVolumes" -}}
{{- $a := .Values.prometheus.auth -}}
{{- range $dir, $secret := dict "bearer" $a.bearerTokenSecret "basic-auth" $a.basicAuthSecret "tls" $a.tlsSecret }}
{{- if $secret.name }}
- name: prometheus-{{ $dir }}
  secret:
    secretName: {{ $secret.name }}
    defaultMode: 0444
{{- end }}
{{- end }}
{{- end }}
