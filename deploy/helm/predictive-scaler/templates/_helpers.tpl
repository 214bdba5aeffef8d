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
