"""What GitOps controllers conclude about a CheckpointRollout, computed by their own rules:
Argo CD runs our health Lua (examples/gitops/checkpointrollout-health.lua) in a real Lua 5.1
(Debian's lua5.1; Argo CD's gopher-lua is 5.1), Flux runs kstatus (e2e/kstatus, on
sigs.k8s.io/cli-utils, built and cached by provision.py)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from .provision import resolve

ROOT = Path(__file__).resolve().parents[2]
HEALTH_LUA = ROOT / "examples" / "gitops" / "checkpointrollout-health.lua"
ARGOCD_CM = ROOT / "examples" / "gitops" / "argocd-health.yaml"
# argocd-cm's key for the health of kind CheckpointRollout in group rollout.ckpt.dev.
HEALTH_KEY = "resource.customizations.health.rollout.ckpt.dev_CheckpointRollout"
LUA = "lua5.1"


class Health(NamedTuple):
    status: str
    message: str


def lua_literal(value: Any) -> str:
    """A JSON value as a Lua table constructor, as Argo CD hands `obj` to the script (arrays
    1-based, null absent)."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{value!r} is not a JSON number")
        return repr(value)
    if isinstance(value, str):
        return _lua_string(value)
    if isinstance(value, Mapping):
        fields = [f"[{_lua_string(str(k))}]={lua_literal(v)}" for k, v in value.items() if v is not None]
        return "{" + ", ".join(fields) + "}"
    if isinstance(value, Sequence):
        return "{" + ", ".join(lua_literal(v) for v in value) + "}"
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def _lua_string(text: str) -> str:
    # Decimal escapes for every byte outside printable ASCII: Lua 5.1 has no \x or \u escapes.
    out = []
    for byte in text.encode():
        char = chr(byte)
        if char in '"\\' or not 0x20 <= byte < 0x7F:
            out.append(f"\\{byte:03d}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


# Runs the script as Argo CD does: a chunk with the global `obj` whose return value is `hs`, in
# an environment with only the libraries Argo CD's VM opens (no io, os, require), so a script
# that leans on more fails here as it would there.
_HARNESS = """
local script = assert(loadfile({script}))
local env = {{obj = {obj}}}
for _, name in ipairs({{"assert", "error", "ipairs", "next", "pairs", "pcall", "select",
    "tonumber", "tostring", "type", "unpack", "string", "table", "math"}}) do
  env[name] = _G[name]
end
setfenv(script, env)
local hs = script()
assert(type(hs) == "table", "the health script returned " .. type(hs) .. ", not a table")
assert(type(hs.status) == "string", "hs.status is " .. type(hs.status))
io.write(hs.status, "\\n", tostring(hs.message or ""))
"""


def argocd_health(obj: Mapping[str, Any], script: Path = HEALTH_LUA) -> Health:
    """Argo CD's health of ``obj`` (a CheckpointRollout as the apiserver returns it)."""
    lua = shutil.which(LUA)
    if lua is None:
        raise RuntimeError(f"{LUA} not found: scripts/install-system-deps.sh gitops installs it")
    chunk = _HARNESS.format(script=_lua_string(str(script)), obj=lua_literal(obj))
    done = subprocess.run([lua, "-"], input=chunk, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{script.name} failed on {obj.get('metadata', {}).get('name')}: {done.stderr}")
    status, _, message = done.stdout.partition("\n")
    return Health(status, message)


def kstatus(objs: Sequence[Mapping[str, Any]]) -> list[Health]:
    """kstatus's status of each object (Current, InProgress, Failed, Terminating, Unknown): what
    Flux's `wait`/`healthChecks` wait on."""
    binary = resolve(["kstatus"])["kstatus"]
    done = subprocess.run(
        [str(binary)], input=json.dumps(list(objs)), capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        raise RuntimeError(f"kstatus failed: {done.stderr}")
    return [Health(v["status"], v["message"]) for v in json.loads(done.stdout)]
