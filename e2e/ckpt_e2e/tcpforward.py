"""A TCP forwarder: ``python -m ckpt_e2e.tcpforward LISTEN_HOST:PORT TARGET_HOST:PORT``.

It lets kube-apiserver, which binds 127.0.0.1 only (what the host's clients and the kwok-only
suite use), also serve the real node's pods: they reach the host end of the node's veth, never
the host's loopback. Bytes pass through untouched, so TLS ends at the apiserver and client
certificates and tokens work as if the pod connected directly; the apiserver's serving
certificate names the listen address. Stdlib only; it runs until SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        # Half-close: a client that sent everything still gets the rest of the answer.
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


async def _serve(listen: tuple[str, int], target: tuple[str, int]) -> None:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            upstream_r, upstream_w = await asyncio.wait_for(asyncio.open_connection(*target), 10)
        except (OSError, TimeoutError):
            client_w.close()  # apiserver down (e.g. restarting): the client sees a reset, as direct
            return
        try:
            await asyncio.gather(_pipe(client_r, upstream_w), _pipe(upstream_r, client_w))
        finally:
            for w in (client_w, upstream_w):
                w.close()

    server = await asyncio.start_server(handle, *listen, reuse_address=True)
    print(f"tcpforward: {listen[0]}:{listen[1]} -> {target[0]}:{target[1]}", flush=True)
    async with server:
        await server.serve_forever()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    asyncio.run(_serve(_address(args[0]), _address(args[1])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
