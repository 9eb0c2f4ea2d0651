"""Benchmarks (`python -m ckpt_e2e.bench ...`): commands that print ratios against limits measured in
the same run. Development-checkout only: neither image ships them (they need the harness and,
for `bench fleet`, iproute2)."""
