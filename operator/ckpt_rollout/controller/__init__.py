"""The controller runtime: the operator process (`ckpt-rollout operator`), its settings, the
kopf handlers, the leader Lease, each CR's daemon loop and the executor that runs a step's Plan.
Never imports the user tools."""
