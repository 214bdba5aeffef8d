{{/*
KEDA's external scaler API: who serves it, and TLS on its port (keda.*).
With keda.highAvailability the <fullname>-keda Deployment (`controller --keda-only`)
serves it beside the controller; the <fullname>-keda Service selects both by the
label below. keda.tls mounts a kubernetes.io/tls Secret into every pod that serves it.
*/}}

{{/* The label shared by every pod that serves KEDA (set only with keda.highAvailability). */}}
{{- define "predictive-scaler.kedaServerLabel" -}}
predictive-scaler.io/serves-keda: "true"
{{- end }}

{{/* Whether a second Deployment serves KEDA ("true" or ""); refuses what cannot work. */}}
{{- define "predictive-scaler.kedaHighAvailability" -}}
{{- $keda := .Values.keda -}}
{{- $ha := $keda.highAvailability | default dict -}}
{{- $tls := $keda.tls | default dict -}}
{{- if and $tls.clientCA (not $tls.secretName) -}}
{{- fail "keda.tls.clientCA (mTLS) needs the server's certificate too: set keda.tls.secretName to a kubernetes.io/tls Secret holding tls.crt, tls.key and ca.crt" -}}
{{- end -}}
{{- if and $tls.secretName (not $keda.enabled) -}}
{{- fail "keda.tls.secretName is set but keda.enabled is false: nothing serves KEDA's API to put TLS on" -}}
{{- end -}}
{{- if $ha.enabled -}}
{{- if not $keda.enabled -}}
{{- fail "keda.highAvailability.enabled needs keda.enabled: the KEDA-only Deployment serves KEDA's API and nothing else" -}}
{{- end -}}
{{- if lt (int $ha.replicas) 2 -}}
{{- fail (printf "keda.highAvailability.replicas is %v: at least 2, or one restart leaves KEDA unanswered" $ha.replicas) -}}
{{- end -}}
true
{{- end -}}
{{- end }}

{{/* Where the TLS Secret is mounted. */}}
{{- define "predictive-scaler.kedaTlsDir" -}}
/etc/predictive-scaler/keda-tls
{{- end }}

{{/* Env of a container serving KEDA (empty without keda.tls.secretName). */}}
{{- define "predictive-scaler.kedaTlsEnv" -}}
{{- $tls := .Values.keda.tls | default dict -}}
{{- if and .Values.keda.enabled $tls.secretName -}}
{{- $dir := include "predictive-scaler.kedaTlsDir" . -}}
- name: PREDICTIVE_SCALER_KEDA_TLS_CERT
  value: {{ $dir }}/tls.crt
- name: PREDICTIVE_SCALER_KEDA_TLS_KEY
  value: {{ $dir }}/tls.key
{{- if $tls.clientCA }}
- name: PREDICTIVE_SCALER_KEDA_TLS_CLIENT_CA
  value: {{ $dir }}/ca.crt
{{- end }}
{{- end -}}
{{- end }}

{{- define "predictive-scaler.kedaTlsMount" -}}
{{- $tls := .Values.keda.tls | default dict -}}
{{- if and .Values.keda.enabled $tls.secretName -}}
- name: keda-tls
  mountPath: {{ include "predictive-scaler.kedaTlsDir" . }}
  readOnly: true
{{- end -}}
{{- end }}

{{/* The Secret, whole: a rotated certificate reaches the pod (not with subPath), and is read again. */}}
{{- define "predictive-scaler.kedaTlsVolume" -}}
{{- $tls := .Values.keda.tls | default dict -}}
{{- if and .Values.keda.enabled $tls.secretName -}}
- name: keda-tls
  secret:
    secretName: {{ $tls.secretName }}
{{- end -}}
{{- end }}
