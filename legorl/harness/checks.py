"""`legorl doctor`'s harness check: the configured harness is installed (for `command`, its
script exists).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from legorl.monitor.doctor import CheckFailed, check

if TYPE_CHECKING:
    from legorl.loop.config import RunConfig


@check("harness installed", timeout=60)
def harness_check(cfg: RunConfig) -> str:
    h = cfg.harness
    if h.name == "command":
        if h.command_file is None or not Path(h.command_file).is_file():
            raise CheckFailed(f"command file {h.command_file} does not exist", fix="set harness.command_file")
        return f"command harness: {h.command_file}"
    try:
        from legorl.harness import install
    except ImportError as e:
        raise CheckFailed(f"harness support is not installed: {e}", fix="reinstall the package") from None
    try:
        mounts = install.mounts_for(h.name)
    except install.HarnessNotInstalled as e:
        raise CheckFailed(str(e), fix="run: bash scripts/setup_harnesses.sh") from None
    return f"{h.name}: {len(mounts)} layer(s) built under {install.layers_root()}"
