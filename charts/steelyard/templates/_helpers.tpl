{{/*
steelyard.namespace is the namespace every namespaced object goes to.
*/}}
{{- define "steelyard.namespace" -}}
{{- required "namespace.name is required" .Values.namespace.name -}}
{{- end -}}

{{/*
steelyard.image is the agent's image reference.
*/}}
{{- define "steelyard.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/*
steelyard.apiServer splits .Values.apiServer ("host:port", "[v6]:port")
into a dict with host and port, failing with a clear message otherwise.
*/}}
{{- define "steelyard.apiServer" -}}
{{- $a := .Values.apiServer -}}
{{- if not (regexMatch "^(\\[[0-9A-Fa-f:.]+\\]|[^:\\[\\]]+):[0-9]{1,5}$" $a) -}}
{{- fail (printf "apiServer %q: want host:port (an IPv6 address in brackets)" $a) -}}
{{- end -}}
{{- $port := regexFind "[0-9]+$" $a -}}
{{- $host := trimSuffix (printf ":%s" $port) $a | trimPrefix "[" | trimSuffix "]" -}}
{{- dict "host" $host "port" $port | toJson -}}
{{- end -}}

{{/*
steelyard.ebpfMounts is "true" when the agent needs the bpffs and the BPF
capability: in mode ebpf, and on the upgrade that leaves it (the live
steelyard-config says MODE ebpf), so the new mode's first sync can detach
and unpin what the ebpf agent left. lookup is empty in helm template, so
manifests/ (the defaults) never has them.
*/}}
{{- define "steelyard.ebpfMounts" -}}
{{- $live := lookup "v1" "ConfigMap" (include "steelyard.namespace" .) "steelyard-config" -}}
{{- if or (eq .Values.mode "ebpf") (eq (dig "data" "MODE" "" $live) "ebpf") -}}
true
{{- end -}}
{{- end -}}
