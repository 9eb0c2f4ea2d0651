"""The load pipeline: open the source and pull (`pull`), read and verify (`reader`, `finite`),
stage, hold the pause gate, apply (`loader`), and the relay copy a load leaves behind.

Peer relay: an agent that loaded and verified a version serves it to other agents, and
agents pull tensor bytes from such a peer while taking the manifest from the original source.

Every byte from a peer is verified against the original manifest's sha256 digests (xxh3 is not
collision-resistant, and a peer chooses its bytes), so a bad peer can make a load fail over to
the source, never inject weights. A manifest without them is loaded from the source.
"""
