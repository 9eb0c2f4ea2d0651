"""The agent's HTTP side: the aiohttp app and its routes (control API, relay routes), request
authentication (TokenReview/SubjectAccessReview, static tokens), the TLS server and the agent's
Kubernetes client."""
