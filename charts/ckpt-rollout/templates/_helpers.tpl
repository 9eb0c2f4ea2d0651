{{/* Chart name, at most 63 characters (a label value). */}}
{{- define "ckpt-rollout.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every object name: the release name, plus the chart name unless it already holds it. */}}
{{- define "ckpt-rollout.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "ckpt-rollout.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ckpt-rollout.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ckpt-rollout.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ckpt-rollout.labels" -}}
helm.sh/chart: {{ include "ckpt-rollout.chart" . }}
{{ include "ckpt-rollout.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ckpt-rollout
{{- end }}

{{- define "ckpt-rollout.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ckpt-rollout.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The ServiceAccount username agents allow (their --allowed-usernames). */}}
{{- define "ckpt-rollout.operatorUsername" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "ckpt-rollout.serviceAccountName" . }}
{{- end }}

{{- define "ckpt-rollout.image" -}}
{{- $repo := .Values.image.repository }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repo .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "ckpt-rollout.leaseNamespace" -}}
{{- default .Release.Namespace .Values.leaderElection.leaseNamespace }}
{{- end }}

{{/*
What the operator calls in each namespace it watches, and nothing else. The same list serves the
ClusterRole (all namespaces) and the per-namespace Roles (watchNamespaces).
*/}}
{{- define "ckpt-rollout.operatorRules" -}}
- apiGroups: ["rollout.ckpt.dev"]
  resources: ["checkpointrollouts"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["rollout.ckpt.dev"]
  resources: ["checkpointrollouts/status"]
  verbs: ["get", "patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
# spec.versionFrom: the operator lists and watches only the ConfigMaps rollouts name (by a
# field selector on the name), and never writes one. A namespaced name cannot be granted ahead.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch"]
# Its own events (create, patch); `list` reads a worker pod's Warning events when its containers
# take long to be created (FailedMount, FailedCreatePodSandBox), to name the cause in the rollout.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch", "list"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# What the worker agents ask SubjectAccessReview before they obey a call: `update` to pause,
# resume and load, `get` to read status. No API serves this resource; RBAC grants it all the same.
- apiGroups: ["rollout.ckpt.dev"]
  resources: ["agents"]
  verbs: ["get", "update"]
{{- end }}

{{/* Namespaces of the worker pods that get the agent's RBAC. */}}
{{- define "ckpt-rollout.workerNamespaces" -}}
{{- if .Values.workerRbac.namespaces }}
{{- toJson .Values.workerRbac.namespaces }}
{{- else }}
{{- toJson (list .Release.Namespace) }}
{{- end }}
{{- end }}
