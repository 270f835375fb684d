"""Old option names, still accepted for a while: on the command line (a note on stderr for each use) and as
--config keys."""

from __future__ import annotations

import sys

# --nproc and --start also collided with torchrun's own options (--nproc-per-node, --start-method) under torchrun.
DEPRECATED = {
    "bench": {"--seq-lens": "--seq-len", "--nproc": "--world-size", "--start": "--start-seq-len"},
    "plan": {"--memory": "--max-memory"},  # --devices is plan's own name again (--target model --devices N)
}
ROOT_OPTIONS_WITH_VALUES = ("--config",)


def rename_deprecated(args: list[str]) -> list[str]:
    """args with deprecated option names replaced by the current ones, a note on stderr for each."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if args[i] in ROOT_OPTIONS_WITH_VALUES else 1
    renames = DEPRECATED.get(args[i], {}) if i < len(args) else {}
    out = list(args)
    for j in range(i + 1, len(out)):
        name, eq, value = out[j].partition("=")
        if name in renames:
            print(f"dattn: note: {name} is deprecated, use {renames[name]}", file=sys.stderr)
            out[j] = renames[name] + eq + value
    return out
