"""A multi-node SGLang server (`--nnodes N --node-rank K`, one replica over N pods): the stand-in
of SGLang 0.5.23's control API (ckpt_e2e.standins.sglang) with tensor-parallel ranks on other nodes. As in
SGLang, only node 0 serves HTTP; an `update_weights_from_disk` is broadcast to every TP
worker's scheduler, and each worker resolves `model_path` on its own node's filesystem
(model_runner's weight iterator opens local files) and writes its weights from there.

Nodes here are directories: node 0 sees the leader agent's staging root, node K the staging root
of the K-th follower's agent, so `model_path` under the leader's root names the same relative path
on each node (pods mount their staging volume at one path). Each node's weights are kept apart,
so a test can tell whether every rank holds one version. A node that cannot resolve the path
fails its own update before writing anything, as a single-node update does ("Failed to get
weights iterator"), and keeps its old weights. What the client is told is rank 0's result alone:
in SGLang's scheduler only the rank that holds the tokenizer socket answers (every other rank's
`send_to_tokenizer` is a no-op, managers/scheduler.py), so an update that failed on another node
still answers 200 with the replica left mixed. That is the situation the rollout's gang (every
follower staged before the leader is asked) exists to prevent.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any, get_args

from aiohttp import web

from ckpt_e2e.standins.engine import GenerationFault, ModelWeights, iter_tensors, weight_files
from ckpt_e2e.standins.sglang import SGLangStandIn


class MultiNodeSGLang(SGLangStandIn):
    def __init__(self, *, leader_root: Path, follower_roots: list[Path], **options: Any) -> None:
        self.leader_root = leader_root
        self.follower_roots = follower_roots
        super().__init__(**options)
        boot_path, boot_dir = self._boot[0], self._boot[1]
        self.node_weights = [ModelWeights(boot_path, boot_dir) for _ in follower_roots]
        self.node_failures: list[str] = []  # what the other ranks logged, never answered
        # Not SGLang's: what a test on the local control plane asks of this process.
        self.app.router.add_get("/standin/nodes", self._nodes)
        self.app.router.add_post("/standin/fault", self._fault)

    async def _nodes(self, request: web.Request) -> web.Response:
        updates = [body for name, body in self.calls if name == "update_weights_from_disk" and body]
        return web.json_response(
            {
                "sources": [sorted(s) for s in self.node_sources()],
                "one_version": self.one_version(),
                "updates": [body.get("weight_version") for body in updates],
                "node_failures": self.node_failures,
            }
        )

    async def _fault(self, request: web.Request) -> web.Response:
        """What generations answer from now on: {"generation": "empty"} (a replica whose new
        weights produce nothing, so the leader's check after a switch fails), null for answers."""
        fault = (await request.json()).get("generation")
        if fault not in (None, *get_args(GenerationFault)):
            return web.json_response({"error": f"unknown fault {fault!r}"}, status=400)
        self.generator.fault = fault
        return web.json_response({"generation": fault})

    def on_node(self, path: str, node: int) -> str:
        """`path` as node `node` (1-based: a follower) resolves it."""
        local = Path(path)
        if not local.is_relative_to(self.leader_root):
            return path  # outside the staging volume (a boot path): the same on every node
        return str(self.follower_roots[node - 1] / local.relative_to(self.leader_root))

    def node_sources(self) -> list[frozenset[str]]:
        """Where each node's weights came from, node 0 first, as that node names the path."""
        return [self.weights.sources(), *(w.sources() for w in self.node_weights)]

    def one_version(self) -> bool:
        """Every node holds a single directory's weights, and the same relative one."""
        names = []
        for node, sources in enumerate(self.node_sources()):
            if len(sources) != 1:
                return False
            (source,) = sources
            root = self.leader_root if node == 0 else self.follower_roots[node - 1]
            names.append(Path(source).relative_to(root) if Path(source).is_relative_to(root) else source)
        return len(set(map(str, names))) == 1

    def _load(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        path: str = body["model_path"]
        for node, weights in enumerate(self.node_weights, start=1):
            local = self.on_node(path, node)
            try:
                files = weight_files(local, self.unmounted)
            except Exception as exc:
                self.node_failures.append(f"node {node}: Failed to get weights iterator: {exc}.")
                continue  # this rank keeps its weights; nobody is told
            weights.load(local, iter_tensors(files))
        return super()._load(request, body)  # rank 0's result is the answer


async def _serve(args: argparse.Namespace) -> None:
    standin = MultiNodeSGLang(
        boot_path=str(args.boot_dir),
        boot_dir=args.boot_dir,
        leader_root=args.leader_root,
        follower_roots=args.follower_root,
    )
    standin.server.host, standin.server.port = args.host, args.port
    await standin.server.start()
    print(f"multi-node SGLang stand-in on {standin.server.url}", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--boot-dir", type=Path, required=True, help="the version every node boots on")
    parser.add_argument("--leader-root", type=Path, required=True, help="node 0's staging root")
    parser.add_argument("--follower-root", type=Path, action="append", default=[], help="node K's, in order")
    asyncio.run(_serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
