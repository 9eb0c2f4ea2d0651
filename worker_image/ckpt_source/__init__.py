"""The checkpoint publisher, a component of its own: `publish` writes a version (shards, extra
files, manifest) that any source serves, and the safetensors and dtype formats it writes in.

The trainer's release client (`ckpt_rollout.tools.client`) and the agent (`publish`, `serve`,
its loaders) both import it; it imports neither, nor paddle at module level.
"""
