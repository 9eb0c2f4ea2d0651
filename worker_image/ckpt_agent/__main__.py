import sys

from ckpt_agent.cli import main

sys.exit(main())
