{{/* Name of every object of this release. */}}
{{- define "denv-cp.fullname" -}}
{{- printf "%s-denv-cp" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select this release's pods. */}}
{{- define "denv-cp.selectorLabels" -}}
app.kubernetes.io/name: denv-cp
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "denv-cp.labels" -}}
{{ include "denv-cp.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* "true" when the pods run in replica mode: more than one, or a replica secret given. */}}
{{- define "denv-cp.replicaMode" -}}
{{- if or (gt (int .Values.replicaCount) 1) .Values.replica.secretName -}}true{{- end -}}
{{- end -}}

{{/* The kubernetes.io/tls Secret to mount, "" without TLS. */}}
{{- define "denv-cp.tlsSecret" -}}
{{- if .Values.tls.secretName -}}
{{- .Values.tls.secretName -}}
{{- else if .Values.tls.cert -}}
{{- printf "%s-tls" (include "denv-cp.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* terminationGracePeriodSeconds: the value given, else drainSeconds + 15. */}}
{{- define "denv-cp.grace" -}}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds -}}
{{- add (int .Values.drainSeconds) 15 -}}
{{- else -}}
{{- int .Values.terminationGracePeriodSeconds -}}
{{- end -}}
{{- end -}}

{{/*
Checks values.schema.json cannot express (or that should fail with a plain message even
when the schema is skipped). Included by deployment.yaml.
*/}}
{{- define "denv-cp.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.replica.secretName) -}}
{{- fail (printf "denv-cp: replicaCount is %d: running more than one replica needs replica.secretName, the name of a Secret holding the replicas' shared secret under key %q (DENV_REPLICA_SECRET); e.g. kubectl create secret generic denv-replica --from-literal=%s=\"$(openssl rand -hex 32)\" and --set replica.secretName=denv-replica" (int .Values.replicaCount) .Values.replica.secretKey .Values.replica.secretKey) -}}
{{- end -}}
{{- if and .Values.tls.cert (not .Values.tls.key) -}}
{{- fail "denv-cp: tls.cert is set without tls.key: TLS needs both (or tls.secretName, an existing kubernetes.io/tls Secret)" -}}
{{- end -}}
{{- if and .Values.tls.key (not .Values.tls.cert) -}}
{{- fail "denv-cp: tls.key is set without tls.cert: TLS needs both (or tls.secretName, an existing kubernetes.io/tls Secret)" -}}
{{- end -}}
{{- if and .Values.tls.secretName .Values.tls.cert -}}
{{- fail "denv-cp: tls.secretName and tls.cert/tls.key are both set: name an existing Secret or give the PEM files, not both" -}}
{{- end -}}
{{- if le (int (include "denv-cp.grace" .)) (add (int .Values.drainSeconds) 10) -}}
{{- fail (printf "denv-cp: terminationGracePeriodSeconds (%s) must be above drainSeconds + 10 (%d): the drain, then up to 10 s for the requests in flight" (include "denv-cp.grace" .) (add (int .Values.drainSeconds) 10)) -}}
{{- end -}}
{{- end -}}
