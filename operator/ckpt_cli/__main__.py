"""`python -m ckpt_cli`: the `ckpt-rollout` command without its console script."""

from ckpt_cli.entry import main

raise SystemExit(main())
