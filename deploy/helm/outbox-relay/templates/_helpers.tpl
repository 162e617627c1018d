{{/* Names and labels shared by every object of the release. */}}
{{- define "outbox-relay.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "outbox-relay.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "outbox-relay.labels" -}}
{{ include "outbox-relay.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "outbox-relay.secretName" -}}
{{- default (include "outbox-relay.fullname" .) .Values.mysql.existingSecret -}}
{{- end -}}

{{/*
Refuses values that would give two pods one MySQL server_id, or an id MySQL cannot take. A pod's
id is the digits of mysql.serverIdPrefix, its ordinal, then 0 (statefulset.yaml): the largest,
the last pod's, must fit MySQL's server_id (1 to 4294967295).
*/}}
{{- define "outbox-relay.validate" -}}
{{- if hasKey .Values.mysql "serverId" }}
{{- fail "mysql.serverId is gone: every pod derives its own server_id from mysql.serverIdPrefix and its ordinal (see values.yaml)" }}
{{- end }}
{{- $prefix := .Values.mysql.serverIdPrefix | int64 }}
{{- if or (lt $prefix 1) (ne (printf "%d" $prefix) (toString .Values.mysql.serverIdPrefix)) }}
{{- fail (printf "mysql.serverIdPrefix must be a positive whole number, not %v" .Values.mysql.serverIdPrefix) }}
{{- end }}
{{- $replicas := .Values.replicaCount | int64 }}
{{- if lt $replicas 1 }}
{{- fail "replicaCount must be at least 1" }}
{{- end }}
{{- $largest := printf "%d%d0" $prefix (sub $replicas 1) }}
{{- if or (gt (len $largest) 10) (gt ($largest | int64) 4294967295) }}
{{- fail (printf "mysql.serverIdPrefix %d with %d replicas gives server_id %s to the last pod: above MySQL's 4294967295; use a shorter prefix" $prefix $replicas $largest) }}
{{- end }}
{{- end -}}
