"""The worker agent: verified, atomic in-place weight loads, plus checkpoint publish/serve.

Importing this package is cheap: paddle, the Kubernetes client and aiohttp are imported only by
the modules that need them, so `ckpt-rollout --help` stays fast.
"""
