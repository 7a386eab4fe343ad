"""The torchscript backend: ``torch.jit.trace`` + ``torch.jit.freeze`` -> ``model.pt``.

Op count: operator nodes of the frozen graph, i.e. nodes, including those in nested blocks, whose kind is
not in the ``prim::`` namespace (constants, list construction, tuple packing and control flow are
bookkeeping, not kernels).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from neuron_build.compilers import graph_key
from neuron_build.compilers.base import CompilerBase, CompileRequest, CompileResult, enter_stage
from neuron_build.loaders import JIT_LOADER

OP_COUNT_SOURCE = "torchscript-frozen-graph: non-prim operator nodes"


def count_graph_ops(graph) -> tuple[int, dict[str, int]]:
    """Count operator nodes of a TorchScript graph, recursing into blocks.

    Returns:
        (total, {op kind: count}).
    """
    kinds: Counter[str] = Counter()

    def walk(nodes):
        for n in nodes:
            if not n.kind().startswith("prim::"):
                kinds[n.kind()] += 1
            for b in n.blocks():
                walk(b.nodes())

    walk(graph.nodes())
    return sum(kinds.values()), dict(sorted(kinds.items()))


class TorchScriptCompiler(CompilerBase):
    """``torch.jit.trace`` then ``torch.jit.freeze``, saved with ``torch.jit.save``."""

    name = "torchscript"

    def compile(self, model, example_inputs, request: CompileRequest) -> CompileResult:
        import torch

        device = request.hardware_target
        model = model.to(device)
        example_inputs = tuple(t.to(device) for t in example_inputs)
        with torch.no_grad():
            enter_stage("export")
            traced = torch.jit.trace(model, example_inputs, check_trace=False)
            enter_stage("compile")
            frozen = torch.jit.freeze(traced.eval())
        # the frozen graph is what is saved: key it before writing anything (a hit stops here)
        graph_key.checkpoint(request, lambda: graph_key.torchscript_document(frozen.graph, frozen))
        out = Path(request.out_dir) / "model.pt"
        enter_stage("save")
        torch.jit.save(frozen, str(out))
        enter_stage("count")
        ops, kinds = count_graph_ops(frozen.graph)
        print(f"op count {ops} over {len(kinds)} operator kinds", flush=True)
        return CompileResult(op_count=ops, op_count_source=OP_COUNT_SOURCE,
                             details={"artifact": "model.pt", "loader": JIT_LOADER, "op_kinds": kinds})


__all__ = ["OP_COUNT_SOURCE", "TorchScriptCompiler", "count_graph_ops"]
