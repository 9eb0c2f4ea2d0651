"""The update service: one load at a time, its state machine, and the status it reports
(to the pod's condition and the CR's worker entry)."""
