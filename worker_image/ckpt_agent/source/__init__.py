"""The agent's checkpoint source server (`serve`); what it serves is written by `ckpt_source`."""
