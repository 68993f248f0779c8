{{/*
Chart name, truncated to 63 characters (a DNS label).
*/}}
{{- define "swapwise.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: the release name, with the chart name appended unless it is already in it.
*/}}
{{- define "swapwise.fullname" -}}
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

{{- define "swapwise.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "swapwise.selectorLabels" -}}
app.kubernetes.io/name: {{ include "swapwise.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end }}

{{- define "swapwise.labels" -}}
helm.sh/chart: {{ include "swapwise.chart" . }}
{{ include "swapwise.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: swapwise
{{- end }}

{{- define "swapwise.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "swapwise.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "swapwise.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
True (non-empty) when the webhook runs inside the cluster, i.e. no webhook.url.
*/}}
{{- define "swapwise.inCluster" -}}
{{- if not .Values.webhook.url }}true{{ end }}
{{- end }}

{{/*
Name of the Secret that holds tls.crt, tls.key and ca.crt.
*/}}
{{- define "swapwise.tlsSecretName" -}}
{{- if eq .Values.certs.mode "secret" }}
{{- required "certs.secretName is required when certs.mode is secret" .Values.certs.secretName }}
{{- else }}
{{- printf "%s-tls" (include "swapwise.fullname" .) }}
{{- end }}
{{- end }}

{{/*
Name of the cert-manager Certificate for the serving certificate.
*/}}
{{- define "swapwise.servingCertificateName" -}}
{{- printf "%s-serving" (include "swapwise.fullname" .) }}
{{- end }}

{{/*
Host of webhook.url ("" when unset). urlParse gives "host:port"; IPv6 hosts come bracketed.
*/}}
{{- define "swapwise.urlHost" -}}
{{- if .Values.webhook.url }}
{{- $host := (urlParse .Values.webhook.url).host }}
{{- if hasPrefix "[" $host }}
{{- regexReplaceAll "^\\[([^\\]]+)\\].*$" $host "${1}" }}
{{- else }}
{{- regexReplaceAll ":[0-9]*$" $host "" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
True (non-empty) when the webhook.url host is an IP address literal.
*/}}
{{- define "swapwise.urlHostIsIP" -}}
{{- $host := include "swapwise.urlHost" . }}
{{- if or (regexMatch "^[0-9]+\\.[0-9]+\\.[0-9]+\\.[0-9]+$" $host) (contains ":" $host) }}true{{ end }}
{{- end }}

{{/*
Names the serving certificate must carry, as a YAML dict {dns: [...], ips: [...]}:
the Service's DNS names in cluster, the webhook.url host otherwise.
*/}}
{{- define "swapwise.certNames" -}}
{{- if include "swapwise.inCluster" . }}
{{- $svc := include "swapwise.fullname" . }}
{{- $ns := .Release.Namespace }}
dns:
  - {{ $svc }}
  - {{ printf "%s.%s" $svc $ns }}
  - {{ printf "%s.%s.svc" $svc $ns }}
  - {{ printf "%s.%s.svc.%s" $svc $ns .Values.clusterDomain }}
ips: []
{{- else if include "swapwise.urlHostIsIP" . }}
dns: []
ips:
  - {{ include "swapwise.urlHost" . | quote }}
{{- else }}
dns:
  - {{ include "swapwise.urlHost" . | quote }}
ips: []
{{- end }}
{{- end }}

{{/*
The selfSigned certificate material as a YAML dict {caCrt, tlsCrt, tlsKey}, base64 encoded.
An existing Secret from an earlier install is reused (so upgrades keep the CA the API server
trusts); otherwise a new CA and serving certificate are generated. genCA is random on each
call, so this must be evaluated once per render: the Secret and the webhook configuration
are rendered from one evaluation in mutatingwebhookconfiguration.yaml.
*/}}
{{- define "swapwise.selfSignedCerts" -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "swapwise.tlsSecretName" .) }}
{{- $data := dig "data" dict $existing }}
{{- if and (index $data "ca.crt") (index $data "tls.crt") (index $data "tls.key") }}
caCrt: {{ index $data "ca.crt" }}
tlsCrt: {{ index $data "tls.crt" }}
tlsKey: {{ index $data "tls.key" }}
{{- else }}
{{- $names := include "swapwise.certNames" . | fromYaml }}
{{- $days := int .Values.certs.selfSigned.validityDays }}
{{- $ca := genCA (printf "%s-ca" (include "swapwise.fullname" .)) $days }}
{{- $cn := first (concat $names.dns $names.ips) }}
{{- $cert := genSignedCert $cn $names.ips $names.dns $days $ca }}
caCrt: {{ $ca.Cert | b64enc }}
tlsCrt: {{ $cert.Cert | b64enc }}
tlsKey: {{ $cert.Key | b64enc }}
{{- end }}
{{- end }}

{{/*
caBundle for the secret mode: accepts PEM or base64-encoded PEM.
*/}}
{{- define "swapwise.secretCaBundle" -}}
{{- $ca := required "certs.caBundle is required when certs.mode is secret" .Values.certs.caBundle | trim }}
{{- if hasPrefix "-----BEGIN" $ca }}
{{- printf "%s\n" $ca | b64enc }}
{{- else }}
{{- $ca }}
{{- end }}
{{- end }}

{{/*
Namespaces no webhook entry ever matches.
*/}}
{{- define "swapwise.excludedNamespaces" -}}
{{- $ns := concat (list .Release.Namespace "kube-system" "kube-node-lease") .Values.webhook.excludeNamespaces | uniq }}
{{- toYaml $ns }}
{{- end }}

{{/*
The policy file (README "Policy reference"). Profile fields pass through as given: the webhook
fills defaults, with one exception (swapwise.backingOff).
*/}}
{{- define "swapwise.policyFile" -}}
{{- include "swapwise.checkPolicy" . }}
apiVersion: swapwise.io/v1alpha1
kind: SwapPolicy
profiles:
  {{- toYaml (include "swapwise.profiles" . | fromYaml) | nindent 2 }}
{{- with .Values.policy.namespaces }}
namespaces:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The profiles as the policy file gets them. Swap backing (placement.swapBacking: required, the
webhook's default) places reshaped pods only on nodes labelled swapwise.io/swap-permille, which
the node agent writes: without the node agent (nodeAgent.enabled false), a profile that does
not set swapBacking itself gets "off", so such an install never strands pods Pending (NOTES.txt
says so).
*/}}
{{- define "swapwise.profiles" -}}
{{- $out := dict }}
{{- range $name, $profile := .Values.policy.profiles }}
{{- $p := deepCopy ($profile | default dict) }}
{{- if not (include "swapwise.nodeAgentEnabled" $) }}
{{- $placement := deepCopy (get $p "placement" | default dict) }}
{{- if not (hasKey $placement "swapBacking") }}
{{- $_ := set $placement "swapBacking" "off" }}
{{- $_ := set $p "placement" $placement }}
{{- end }}
{{- end }}
{{- $_ := set $out $name $p }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/*
The profiles whose swap backing the chart turned off (no node agent, not set in the profile).
*/}}
{{- define "swapwise.backingOff" -}}
{{- if not (include "swapwise.nodeAgentEnabled" .) }}
{{- range $name, $profile := .Values.policy.profiles }}
{{- if not (hasKey (get ($profile | default dict) "placement" | default dict) "swapBacking") }}
{{ $name }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Rules values.schema.json cannot state with a clear message.
*/}}
{{- define "swapwise.checkPolicy" -}}
{{- range $name, $profile := .Values.policy.profiles }}
{{- if and (hasKey $profile "swapRatio") (hasKey $profile "requestRatio") }}
{{- fail (printf "policy.profiles.%s: give swapRatio or requestRatio, not both" $name) }}
{{- end }}
{{- end }}
{{- range $ns, $override := .Values.policy.namespaces }}
{{- if and (hasKey $override "swapRatio") (hasKey $override "requestRatio") }}
{{- fail (printf "policy.namespaces.%s: give swapRatio or requestRatio, not both" $ns) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The port the server listens on: the node's port in hostNetwork mode, else the container's.
*/}}
{{- define "swapwise.listenPort" -}}
{{- if .Values.hostNetwork.enabled }}{{ .Values.hostNetwork.port }}{{ else }}{{ .Values.service.targetPort }}{{ end }}
{{- end }}

{{/*
Seconds the server keeps serving after SIGTERM (--drain-seconds). Unless set, long enough for
a failing readiness probe to withdraw the endpoint when nothing else did: a container stopped
by its runtime (not a pod deletion, which withdraws it at once) must not close its port while
the Service still sends the API server to it.
*/}}
{{- define "swapwise.drainSeconds" -}}
{{- if kindIs "invalid" .Values.drainSeconds }}
{{- $p := .Values.readinessProbe }}
{{- add (mul (default 10 $p.periodSeconds) (default 3 $p.failureThreshold)) 2 }}
{{- else }}
{{- .Values.drainSeconds }}
{{- end }}
{{- end }}

{{/*
True (non-empty) in mode webhook (the default): the server, its certificate, its webhook
configuration and its policy ConfigMap are rendered. mode admissionPolicy renders none of
them (templates/admission-policy.yaml).
*/}}
{{- define "swapwise.webhookMode" -}}
{{- if eq .Values.mode "webhook" }}true{{ end }}
{{- end }}

{{/*
The chart's labels on the admission policies of mode admissionPolicy (component
admission-policy, not webhook).
*/}}
{{- define "swapwise.policyLabels" -}}
helm.sh/chart: {{ include "swapwise.chart" . }}
app.kubernetes.io/name: {{ include "swapwise.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: admission-policy
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: swapwise
{{- end }}

{{/*
A regular expression matching the metrics only `swapwise serve` exports (README
"Operations"): alert rules and dashboard panels on them are left out in mode admissionPolicy.
*/}}
{{- define "swapwise.serverMetrics" -}}
\bswapwise_(admission|containers_changed|policy|certificate|watcher)_
{{- end }}

{{/*
The node agent's name: its DaemonSet, ServiceAccount, ClusterRole(Binding) and admission
policy (and binding) all carry it.
*/}}
{{- define "swapwise.nodeAgentName" -}}
{{- printf "%s-node-agent" (include "swapwise.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
True (non-empty) when the node agent runs (`nodeAgent.enabled`, the default): the agent writes
swapwise.io/swap-permille, which swap backing needs.
*/}}
{{- define "swapwise.nodeAgentEnabled" -}}
{{- if .Values.nodeAgent.enabled }}true{{ end }}
{{- end }}

{{/*
The install notes' paragraph on the node agent (both modes).
*/}}
{{- define "swapwise.nodeAgentNotes" -}}
{{- if include "swapwise.nodeAgentEnabled" . }}
{{- $name := include "swapwise.nodeAgentName" . }}

The node agent runs on every Linux node: it labels the swap nodes (swapwise.io/swap-node,
swapwise.io/swap-permille) and marks nodes under memory or CPU pressure; a
ValidatingAdmissionPolicy lets it change only swapwise.io/ keys of its own Node.

     kubectl -n {{ .Release.Namespace }} rollout status daemonset/{{ $name }}
{{- if eq .Values.nodeAgent.swapBehaviorSource "declared" }}

A node is a swap node once it has swap and its kubelet's swapBehavior is declared:

     kubectl label node <node> swapwise.io/swap-behavior=LimitedSwap
{{- end }}
{{- if .Values.nodeAgent.kubepodsPressure }}

Its pods mount the host's /sys/fs/cgroup read-only (hostPath): a namespace that enforces
PodSecurity baseline or restricted refuses them (set nodeAgent.kubepodsPressure=false there).
{{- end }}
{{- end }}
{{- end }}
