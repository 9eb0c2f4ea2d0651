"""The pure domain: the reconcile machine and the functions it is made of (wave planning,
condition evaluation, outcomes, pinning). No I/O: no Kubernetes client, no HTTP, no asyncio."""
