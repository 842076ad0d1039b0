{{- define "nvke.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "nvke.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "nvke.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "nvke.fullname" .) -}}
{{- end -}}

{{- define "nvke.labels" -}}
app.kubernetes.io/part-of: nvke
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{/* The restricted Pod Security profile, pod level. */}}
{{- define "nvke.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The restricted Pod Security profile, container level (read-only root: emptyDir /tmp). */}}
{{- define "nvke.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{- define "nvke.env" -}}
envFrom:
  - configMapRef:
      name: {{ include "nvke.fullname" . }}-config
  - secretRef:
      name: {{ required "existingSecret: the Secret with DATABASE_URL, REDIS_URL, SECRET_KEY, NVKE_SECRET_KEYS, EMAIL_URL" .Values.existingSecret }}
{{- end -}}

{{- define "nvke.podCommon" -}}
serviceAccountName: {{ include "nvke.serviceAccountName" . }}
automountServiceAccountToken: false
securityContext:
  {{- include "nvke.podSecurityContext" . | nindent 2 }}
{{- end -}}
