"""Formats every agent layer shares: the manifest as the agent reads it and the synthetic
reference checkpoint (safetensors and dtypes are `ckpt_source`'s)."""
