"""Mooncake transfer engine support: one engine per process (`runtime`), the JSON descriptor a
server publishes (`descriptor`), and the server side that registers memory (`export`). The
client transport lives in `ckpt_agent.transport.mooncake.client`."""
