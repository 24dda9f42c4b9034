{{- /*
Labels every object carries; the selector labels are the part that never changes across
upgrades (a DaemonSet's selector is immutable).
*/ -}}
{{- define "resmgr.selectorLabels" -}}
app.kubernetes.io/name: resmgr
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "resmgr.labels" -}}
{{ include "resmgr.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{- /*
An address and a port as the agent takes them: IPv6 addresses in brackets ("::" and 8891 give
"[::]:8891"), IPv4 addresses as they are. Takes (list ADDRESS PORT).
*/ -}}
{{- define "resmgr.hostPort" -}}
{{- $host := trimPrefix "[" (trimSuffix "]" (toString (index . 0))) -}}
{{- if contains ":" $host -}}
[{{ $host }}]:{{ index . 1 }}
{{- else -}}
{{ $host }}:{{ index . 1 }}
{{- end -}}
{{- end }}

{{- /*
The agent's configuration file: the settings the chart's own values decide (paths it mounts,
ports it exposes, the driver its objects name), then every other setting from .Values.config.
*/ -}}
{{- /* Whether the agent marks waiting pods: only with the admission policy that confines it. */ -}}
{{- define "resmgr.retryWaitingPods" -}}
{{- and .Values.retryWaitingPods .Values.admissionPolicy.enabled .Values.config.dra -}}
{{- end -}}

{{- define "resmgr.configFile" -}}
{{- $derived := dict
  "driver-name" .Values.driverName
  "nri-socket" (printf "%s/nri.sock" .Values.nri.socketDir)
  "kubelet-plugins-dir" (printf "%s/plugins" .Values.kubelet.rootDir)
  "kubelet-registry-dir" (printf "%s/plugins_registry" .Values.kubelet.rootDir)
  "cdi-dir" .Values.cdi.specDir
  "state-dir" .Values.stateDir
  "metrics-addr" (include "resmgr.hostPort" (list .Values.metrics.bindAddress .Values.metrics.port))
  "debug-addr" (ternary (include "resmgr.hostPort" (list .Values.debug.bindAddress .Values.debug.port)) "off" .Values.debug.enabled)
  "retry-waiting-pods" (include "resmgr.retryWaitingPods" . | eq "true")
-}}
{{- range $key, $_ := $derived }}
{{- if hasKey $.Values.config $key }}
{{- fail (printf "config.%s: the chart sets %s from its own values (see values.yaml), not from config" $key $key) }}
{{- end }}
{{- end -}}
{{- $config := dict }}
{{- /* An empty string leaves the setting to the agent's default. */ -}}
{{- range $key, $value := .Values.config }}
{{- if not (and (kindIs "string" $value) (eq $value "")) }}
{{- $_ := set $config $key $value }}
{{- end }}
{{- end }}
{{- /*
The agent's own pods run on the reserved CPUs, as the node's other system pods do: in a namespace
of their own they would otherwise be shared containers, and on a small node keep the last shared
CPU from an exclusive container.
*/ -}}
{{- $reservedNamespaces := get $config "reserved-namespaces" }}
{{- if and (kindIs "slice" $reservedNamespaces) (not (has .Release.Namespace $reservedNamespaces)) }}
{{- $_ := set $config "reserved-namespaces" (append $reservedNamespaces .Release.Namespace) }}
{{- end }}
{{- /* reserved-cpus names the CPUs, reserved-cpu-count picks that many: the agent takes one. */ -}}
{{- if hasKey $config "reserved-cpus" }}
{{- $_ := unset $config "reserved-cpu-count" }}
{{- end -}}
# resmgr run --config: rendered by the resmgr Helm chart from its values.
apiVersion: resmgr.io/v1alpha1
kind: AgentConfiguration
{{ toYaml (merge $derived $config) }}
{{- end }}
