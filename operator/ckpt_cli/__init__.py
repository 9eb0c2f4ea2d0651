"""The `ckpt-rollout` command line (and its `kubectl ckpt` plugin name): the composition root over
the product packages. Both images carry it; each registers the command groups of the packages it
installs. No product package imports it, and it never imports the test harness (the benches are
`python -m ckpt_e2e.bench`)."""
