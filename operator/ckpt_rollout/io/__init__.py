"""I/O: the apiserver (client, pod and ConfigMap caches over one watch stream), the agents
(HTTP client, per-namespace tokens), Prometheus queries and the operator's own metrics."""
