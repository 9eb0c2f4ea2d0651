"""Formats every layer shares: the checkpoint manifest, safetensors, dtypes, and the synthetic
reference checkpoint."""
