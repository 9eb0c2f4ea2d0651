// The kstatus checker the e2e tier runs on recorded CheckpointRollouts (e2e/ckpt_e2e/gitops.py).
// provision.py builds it like the control plane: go.sum is filled by `go build -mod=mod` in the
// cache's build directory, never committed.
module ckpt-rollout.local/e2e/kstatus

go 1.26

require sigs.k8s.io/cli-utils v0.37.2
