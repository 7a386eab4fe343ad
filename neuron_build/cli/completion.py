"""``neuron-build completion {bash,zsh,tcsh}``: print a shell completion script for ``neuron-build``.

The script is generated from the argument parser by shtab (https://github.com/iterative/shtab, the one
DVC uses), so it completes every command and option of this version. Install it, e.g. for bash::

    neuron-build completion bash > ~/.local/share/bash-completion/completions/neuron-build
"""

from __future__ import annotations

from neuron_build.cli.app import command, display_text
from neuron_build.errors import ExitCode

__all__ = ["SHELLS", "register", "cmd_completion"]

SHELLS = ("bash", "zsh", "tcsh")


def register(add) -> None:
    """Add the ``completion`` sub-command."""
    s = add("completion", "print a shell completion script (bash, zsh, tcsh)")
    s.add_argument("shell", choices=SHELLS)


@command("completion")
def cmd_completion(args) -> int:
    """Print the completion script of ``args.shell`` on stdout."""
    import shtab

    from neuron_build.cli import parser

    display_text(shtab.complete(parser(), shell=args.shell))
    return ExitCode.OK
