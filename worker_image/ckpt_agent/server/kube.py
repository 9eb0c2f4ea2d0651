"""Kubernetes API access for the agent: in-cluster config, else KUBECONFIG (for agents run as
local processes against a local apiserver). Imports the client lazily."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

_SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def kube_config_available() -> bool:
    if os.environ.get("KUBERNETES_SERVICE_HOST") and (_SERVICE_ACCOUNT_DIR / "token").exists():
        return True
    paths = os.environ.get("KUBECONFIG", "").split(os.pathsep) if os.environ.get("KUBECONFIG") else []
    paths.append(str(Path.home() / ".kube" / "config"))
    return any(p and Path(p).is_file() for p in paths)


async def new_api_client() -> Any:
    """An ApiClient from in-cluster config, falling back to KUBECONFIG / ~/.kube/config."""
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        # KUBECONFIG as it is now (a list of files is merged, as kubectl does): kubernetes_asyncio
        # reads the variable once, when it is imported, and would keep an older value.
        files = os.environ.get("KUBECONFIG") or None
        await config.load_kube_config(config_file=files, client_configuration=configuration)
    return client.ApiClient(configuration=configuration)
