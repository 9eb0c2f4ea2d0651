"""`python -m ckpt_e2e.bench dataplane|fleet|controlplane [flags]`."""

from ckpt_e2e.bench.cli import main

raise SystemExit(main())
