"""``neuron-build init [DIR]``: scaffold a project: ``buckets.toml``, ``dodo.py`` and a ``models/`` example.

Refuses (exit 2), writing nothing, when any of the files exists already.
"""

from __future__ import annotations

from pathlib import Path

from neuron_build.cli.app import command, display_text, print_json
from neuron_build.errors import ExitCode, UserError

__all__ = ["BUCKETS_TOML", "DODO", "EXAMPLE", "FILES", "register", "scaffold", "cmd_init"]

BUCKETS_TOML = '''# neuron-build matrix: models x shape buckets x dtypes x compiler profiles (see README.md).
[build]
store = "artifacts"      # folder relative to this file
backend = "auto"         # neuron when the Neuron toolchain is installed, else inductor
target = "trn1"          # Neuron hardware target: trn1 | trn1n | trn2 | inf2
timeout_s = 1800

[profiles.o2]
compiler_args = ["--optlevel=2"]

[models.mlp]
factory = "models.example:build"   # module path relative to this file's folder
kwargs = { width = 256 }
dtypes = ["fp32", "bf16"]
profiles = ["o2"]
inputs = [{ name = "x", shape = ["batch", 256] }]
buckets = { batch = [1, 8] }

# A Hugging Face model needs no factory: a folder holding config.json and the weights (relative to this
# file's folder), or an installed package that ships one, loaded offline (see README.md, buckets.toml):
# [models.encoder]
# hf = "my-model"                  # the folder or the package
# auto_class = "AutoModel"         # the default; or AutoModelForSequenceClassification, ...
# output = "last_hidden_state"     # the default for AutoModel; logits for the AutoModelFor... heads
# dtypes = ["fp32"]
# profiles = ["o2"]
# inputs = [
#   { name = "input_ids", shape = ["batch", "seq"], dtype = "int64", range = [0, 30522] },
#   { name = "attention_mask", shape = ["batch", "seq"], dtype = "int64", range = [1, 2] },
# ]
# buckets = { batch = [1], seq = [128] }

[release]
channels = ["dev", "staging", "prod"]
'''

DODO = "from neuron_build.tasks import *  # noqa: F401,F403  (doit build, doit list, doit validate)\n"

EXAMPLE = '''"""An example model: a two-layer MLP. A factory returns an nn.Module; its kwargs come from buckets.toml."""

import torch
from torch import nn


def build(width: int = 256) -> nn.Module:
    """An MLP over inputs [batch, width] (float), returning [batch, width]."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
'''

#: Relative path -> content of every file ``init`` writes.
FILES = {"buckets.toml": BUCKETS_TOML, "dodo.py": DODO, "models/__init__.py": "", "models/example.py": EXAMPLE}


def register(add) -> None:
    """Add the ``init`` sub-command."""
    s = add("init", "create buckets.toml, dodo.py and a models/ example in a folder (never overwrites)")
    s.add_argument("dir", nargs="?", default=".", metavar="DIR", help="the project folder (default: here)")
    s.add_argument("--json", action="store_true")


def scaffold(root: Path) -> list[str]:
    """Write :data:`FILES` under ``root`` and return their paths.

    Raises:
        UserError: ``root`` is a file, or one of the files exists (nothing is written then).
    """
    if root.exists() and not root.is_dir():
        raise UserError(f"{root} is a file; give a folder for the new project")
    there = [rel for rel in FILES if (root / rel).exists()]
    if there:
        verb = "exists" if len(there) == 1 else "exist"
        raise UserError(f"{root}: {', '.join(there)} already {verb}; init writes nothing over existing files "
                        f"(remove them or choose another folder)")
    out = []
    for rel, text in FILES.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "x") as fh:  # exclusive: never replaces a file created meanwhile
            fh.write(text)
        out.append(str(p))
    return out


@command("init")
def cmd_init(args) -> int:
    """Scaffold a project in DIR."""
    root = Path(args.dir)
    written = scaffold(root)
    if args.json:
        print_json({"dir": str(root), "files": written})
        return ExitCode.OK
    for p in written:
        display_text(f"created {p}")
    cd = "" if root.resolve() == Path.cwd().resolve() else f"cd {root} && "
    display_text(f"next: {cd}neuron-build plan && neuron-build build")
    return ExitCode.OK
