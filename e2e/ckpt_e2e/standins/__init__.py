"""Stand-ins for engine servers we cannot run here (SGLang, and SGLang across nodes), each
rebuilt from that engine's code at a named version: the agent tests run them in-process, the
rollouts on the local control plane as processes (`python -m ckpt_e2e.standins.multinode`)."""
