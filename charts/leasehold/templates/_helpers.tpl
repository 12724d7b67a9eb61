{{/* Full name of the release's objects. */}}
{{- define "leasehold.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Common labels. */}}
{{- define "leasehold.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels. */}}
{{- define "leasehold.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The controller's ServiceAccount name. */}}
{{- define "leasehold.serviceAccountName" -}}
{{- default (include "leasehold.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* The controller pods' labels: podLabels, then the selector labels (which win). */}}
{{- define "leasehold.podLabels" -}}
{{- $labels := mergeOverwrite (deepCopy .Values.podLabels) (include "leasehold.selectorLabels" . | fromYaml) -}}
{{- toYaml $labels -}}
{{- end -}}

{{/* policy/v1 PodDisruptionBudget from Kubernetes 1.21; policy/v1beta1 before. */}}
{{- define "leasehold.pdbApiVersion" -}}
{{- if semverCompare ">=1.21-0" .Capabilities.KubeVersion.Version -}}
policy/v1
{{- else -}}
policy/v1beta1
{{- end -}}
{{- end -}}

{{/* The controller's rules on locks, claims, pods and events (a ClusterRole's, or watchNamespace's Role's). */}}
{{- define "leasehold.watchRules" -}}
# Watch locks; write their status (one optimistic PUT per decision); add and remove
# the finalizer that keeps a deleted lock until its holders have stopped.
- apiGroups: ["leasehold.dev"]
  resources: ["distributedlocks"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["leasehold.dev"]
  resources: ["distributedlocks/status"]
  verbs: ["update"]
# Watch claims (a fresh read before expiring one); write a designated successor's
# signed grant on its claim when the claim asks for it; delete finished claims
# (released ones in one deletecollection per namespace).
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "list", "watch", "patch", "delete", "deletecollection"]
# Watch the pods that own claims (name, uid, phase); a fresh read before an etcd key
# of a gone pod is held back.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
# Events on locks and claims.
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- if .Values.etcdBackend.readTlsSecrets }}
# The etcd backend: read a lock's spec.backend.etcd.tlsSecretRef to reach its etcd
# (etcdBackend.readTlsSecrets: any Secret; etcdBackend.tlsSecrets names them instead).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}
{{- end -}}

{{/* The webhook's Service name. */}}
{{- define "leasehold.admissionService" -}}
{{- printf "%s-admission" (include "leasehold.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Where the client accounts are confined to claims (a NamespaceSelector as YAML), or nothing. */}}
{{- define "leasehold.confineSelector" -}}
{{- if .Values.admission.confineNamespaceSelector -}}
{{- toYaml .Values.admission.confineNamespaceSelector -}}
{{- else if .Values.clientRbac.namespaces -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: In
    values: {{ toJson .Values.clientRbac.namespaces }}
{{- end -}}
{{- end -}}

{{/* The accounts lock clients run as, comma-separated: admission.clientAccounts and clientRbac.serviceAccounts. */}}
{{- define "leasehold.clientAccounts" -}}
{{- concat .Values.admission.clientAccounts .Values.clientRbac.serviceAccounts | uniq | join "," -}}
{{- end -}}
