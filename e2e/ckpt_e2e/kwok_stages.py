"""kwok Stage objects: the fake kubelet's behaviour, passed to kwok with --config.

Standalone kwok has no built-in stages ("no stages found"), and a kwok binary supplied by the
user comes without the module's stage files, so the harness carries its own minimal set:
nodes become Ready and heart-beat; scheduled pods become Running at once with an IP from
their node's podCIDR (or the one their POD_IP_ANNOTATION names); pods marked for deletion
are removed. The templates use kwok's
documented template functions (NodeConditions, NodeIP, PodIPsWith, ...).
"""

from __future__ import annotations

_NODE_INITIALIZE = """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: ckpt-node-initialize
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: NotIn
      values: ['True']
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
      addresses:
      - {address: {{ NodeIP | Quote }}, type: InternalIP}
      - {address: {{ NodeName | Quote }}, type: Hostname}
      allocatable: {cpu: 1k, memory: 1Ti, pods: "__PODS__"}
      capacity: {cpu: 1k, memory: 1Ti, pods: "__PODS__"}
      nodeInfo:
        architecture: amd64
        operatingSystem: linux
        kubeletVersion: kwok-__KWOK_VERSION__
        kubeProxyVersion: kwok-__KWOK_VERSION__
        containerRuntimeVersion: kwok-__KWOK_VERSION__
        kernelVersion: kwok-__KWOK_VERSION__
        bootID: ""
        machineID: ""
        osImage: ""
        systemUUID: ""
      phase: Running
"""

# The node-lifecycle controller taints a node whose heartbeat is older than its grace
# period (~50 s) and then evicts its pods; refresh well inside that.
_NODE_HEARTBEAT = """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: ckpt-node-heartbeat
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: In
      values: ['True']
  delay: {durationMilliseconds: 10000, jitterDurationMilliseconds: 12000}
  immediateNextStage: true
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
"""

_POD_READY = """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: ckpt-pod-ready
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: DoesNotExist
    - key: '.status.phase'
      operator: In
      values: [Pending]
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: PodScheduled, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: ContainersReady, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: Ready, status: "True", lastTransitionTime: {{ $now | Quote }}}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        ready: true
        restartCount: 0
        state: {running: {startedAt: {{ $now | Quote }}}}
      {{ end }}
      {{ with NodeIPsWith .spec.nodeName }}
      hostIP: {{ index . 0 | Quote }}
      hostIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      {{ $ip := "" }}
      {{ with .metadata.annotations }}
      {{ with index . "__POD_IP_ANNOTATION__" }}{{ $ip = . }}{{ end }}
      {{ end }}
      {{ if $ip }}
      podIP: {{ $ip | Quote }}
      podIPs:
      - ip: {{ $ip | Quote }}
      {{ else }}
      {{ with PodIPsWith .spec.nodeName ( or .spec.hostNetwork false )
           ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
      podIP: {{ index . 0 | Quote }}
      podIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      {{ end }}
      phase: Running
      startTime: {{ $now | Quote }}
"""

# A pod annotated with this gets the address it names instead of one from its node's podCIDR:
# a bench whose agents live in network namespaces (`bench release`) makes pods the operator
# reaches at those agents' addresses.
POD_IP_ANNOTATION = "ckpt-e2e.dev/pod-ip"

# Pods with this label leave as a kubelet lets them: the stage below leaves them alone, and the
# pod runtime (podruntime.PodRuntime) deletes one once it has stopped its process, so an agent that
# reports as it shuts down does so while its pod (and the token bound to it) still exists.
KUBELET_STOP_LABEL = "ckpt-e2e-kubelet-stop"

# No grace period: the pod-runtime stand-in stops the pod's process as soon as it sees the
# deletionTimestamp, like a kubelet that got SIGTERM through quickly.
_POD_DELETE = """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: ckpt-pod-delete
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: Exists
    - key: '.metadata.labels["__KUBELET_STOP__"]'
      operator: DoesNotExist
  next:
    finalizers: {empty: true}
    delete: true
"""


def stages_yaml(max_pods_per_node: int, kwok_version: str) -> str:
    docs = (_NODE_INITIALIZE, _NODE_HEARTBEAT, _POD_READY, _POD_DELETE)
    text = "---".join(docs)
    text = text.replace("__PODS__", str(max_pods_per_node)).replace("__KWOK_VERSION__", kwok_version)
    text = text.replace("__POD_IP_ANNOTATION__", POD_IP_ANNOTATION)
    return text.replace("__KUBELET_STOP__", KUBELET_STOP_LABEL)
