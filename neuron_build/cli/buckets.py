"""``neuron-build buckets suggest MODEL --traffic FILE... --max-buckets K [--dim D] [--multiple M] [--json]
[--write] [--narrow] [--force]``: the buckets that minimise padding on recorded serving traffic (:mod:`neuron_build.traffic`,
:mod:`neuron_build.project.bucket_search`), beside the current buckets' padding; ``--write`` puts them into
``buckets.toml`` (comments kept) and prints the plan's difference."""

from __future__ import annotations

import argparse
from pathlib import Path

from neuron_build.cli.app import command, display_note, display_text, open_project, positive_int, print_json
from neuron_build.errors import ExitCode, UserError
from neuron_build.util import plural

SUGGEST_HELP = """\
Padding ratio over the searched dims: sum(count * (prod bucket - prod value)) / sum(count * prod value)
over the requests the buckets serve (one dim: sum(count * (bucket - value)) / sum(count * value)).
A suggestion serves every request in one call (its largest size >= the largest value seen), and keeps
today's largest bucket of each dim (--narrow: it may end at the largest value seen instead).
One dim: the exact optimum (dynamic programming over the observed values, or with --multiple over
the values rounded up to multiples of M, which is still exact over sizes that are multiples of M).
Several dims (the default for a model with several bucket dims; --dim picks some, the others are
left as they are and summed out): for every split K1 x K2 ... <= K of the NEFF budget, exact
(every list of the other dims enumerated, the dim with most values solved exactly) while those
lists x distinct shapes are at most 200000; otherwise coordinate descent: each dim re-solved exactly given
the others until nothing improves (padding never rises; not always the joint optimum). The method
used is printed. Traffic files: what BucketedModel.save_traffic writes; any number, summed."""


def register(add) -> None:
    """Add the ``buckets`` command and its ``suggest`` sub-command."""
    s = add("buckets", "buckets from serving traffic: suggest the ones with the least padding")
    sub = s.add_subparsers(dest="buckets_command", required=True, metavar="SUBCOMMAND")
    p = sub.add_parser("suggest", help="the buckets that minimise padding on recorded traffic for K NEFFs",
                       description="The buckets that minimise padding on recorded traffic for K NEFFs, beside "
                                   "the current buckets' padding.", epilog=SUGGEST_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-c", "--config", default=argparse.SUPPRESS, help="path of buckets.toml")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--traffic", nargs="+", required=True, metavar="FILE",
                   help="traffic files written by BucketedModel.save_traffic (summed)")
    p.add_argument("--dim", action="append", metavar="DIM",
                   help="search this bucket dim (repeat for several; default: every bucket dim of the model)")
    p.add_argument("--max-buckets", type=positive_int, required=True, metavar="K",
                   help="the most buckets (NEFFs per dtype and profile) over the searched dims")
    p.add_argument("--multiple", type=positive_int, metavar="M",
                   help="every suggested size a multiple of M (compilers prefer 64 or 128); with several "
                        "dims searched, batch sizes are not rounded")
    p.add_argument("--json", action="store_true")
    p.add_argument("--write", action="store_true",
                   help="write the suggestion into buckets.toml (comments kept) and print the plan's difference; "
                        "refused when the suggestion pads more than the current buckets or serves less (a smaller "
                        "largest bucket), unless --force")
    p.add_argument("--narrow", action="store_true",
                   help="let the search end a dim below today's largest bucket when the traffic never reached it "
                        "(default: today's largest bucket is kept, so nothing served today is refused)")
    p.add_argument("--force", action="store_true",
                   help="with --write: write a suggestion even when it pads more or serves less than the current "
                        "buckets")


def _fmt_buckets(b: dict) -> str:
    return " ".join(f"{d}={list(v)}" for d, v in b.items())


def _pct(r: float | None) -> str:
    return "-" if r is None else f"{100 * r:.2f} %"


@command("buckets")
def cmd_buckets(args) -> int:
    """``buckets suggest``: print (or ``--json``) the current and suggested buckets and the per-K curve;
    ``--write`` edits ``buckets.toml``. Exit 0; 2 for a user error (one line)."""
    from neuron_build.project.bucket_search import narrower_dims, suggestion
    from neuron_build.project.config_edit import apply_suggestion, refusal
    from neuron_build.traffic import model_traffic

    project = open_project(args)
    models = project.config.models
    if args.model not in models:
        raise UserError(f"unknown model '{args.model}'; {project.path} has: {', '.join(models)}")
    spec = models[args.model]
    if not spec.buckets:
        raise UserError(f"model '{args.model}' has no bucket dims (its inputs have fixed shapes); nothing to suggest")
    dims = list(dict.fromkeys(args.dim or spec.buckets))
    for d in dims:
        if d not in spec.buckets:
            raise UserError(f"'{d}' is not a bucket dim of model '{args.model}' (its bucket dims: "
                            f"{', '.join(spec.buckets)}); give --dim {' or --dim '.join(spec.buckets)}")
    mt = model_traffic(args.model, args.traffic, dims)
    if spec.task == "text-generation" and "seq" in dims:  # the KV cache bounds every prompt
        longest = max((dict(k).get("seq", 0) for k, _b in mt.shapes), default=0)
        if longest > (spec.max_seq_len or 0):
            raise UserError(f"{', '.join(args.traffic)}: holds prompts of up to {longest} tokens, more than "
                            f"max_seq_len = {spec.max_seq_len} of [models.{args.model}]: no prefill bucket can "
                            f"serve them; raise max_seq_len in {project.path.name} (and rebuild) or leave those "
                            f"requests out of the traffic")
    try:
        doc = suggestion(spec, mt, dims, args.max_buckets, args.multiple, narrow=args.narrow)
    except ValueError as e:
        raise UserError(f"{', '.join(args.traffic)}: {e}; serve some requests first") from None
    other = [d for d in spec.buckets if d not in dims]
    out = {"schema": "neuron-build/buckets-suggest/v1", "model": args.model, "files": list(args.traffic),
           "releases": mt.releases, "overflow_calls": mt.overflow_calls, "max_buckets": args.max_buckets,
           "multiple": args.multiple, "other_dims": {d: list(spec.buckets[d]) for d in other}, **doc}
    out["narrower_than_current"] = narrower_dims(doc)
    if args.write:
        out["written"] = apply_suggestion(project, args.model, out, force=args.force)
    if args.json:
        print_json(out)
        return ExitCode.OK
    display_text(format_suggestion(out))
    w = out.get("written")
    if w:
        display_text(format_written(w))
    elif not args.write:
        why = refusal(out)
        if why:   # never advise what --write refuses
            display_text(f"next: {', '.join(why[1])}, or add --write --force")
        else:
            display_text(f"next: add --write to put the suggested buckets into {project.path.name}, then `neuron-build "
                         f"build {args.model}` compiles only the new targets")
    return ExitCode.OK


def format_suggestion(out: dict) -> str:
    """The text of ``buckets suggest``: the traffic, current vs suggested, and the padding per NEFF budget."""
    cur, sug = out["current"], out["suggested"]
    head = (f"{out['model']}: {out['requests']:,} requests ({out['distinct']} distinct over "
            f"{', '.join(out['dims'])}) from {plural(len(out['files']), 'traffic file')}")
    rows = [("", "buckets", "NEFFs", "padding", "unserved"),
            ("current", _fmt_buckets(cur["buckets"]), str(cur["neffs"]), _pct(cur["padding_ratio"]),
             f"{cur['unserved']:,}"),
            ("suggested", _fmt_buckets(sug["buckets"]), str(sug["neffs"]), _pct(sug["padding_ratio"]),
             f"{sug['unserved']:,}")]
    w = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [head] + ["  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip() for r in rows]
    lines.append(f"method: {out['method']}" + (f"; sizes multiples of {out['multiple']}" if out["multiple"] else ""))
    if out["suggested_source"] == "current":
        lines.append(f"the current buckets pad least: no {out['max_buckets']} or fewer buckets searched pad less; "
                     f"keep them")
    for d, v in (out.get("narrower_than_current") or {}).items():
        lines.append(f"NARROWER THAN TODAY: the suggestion serves {d} up to {v['suggested']}, the current buckets up to "
                     f"{v['current']}; --write refuses it without --force")
    if out["worse_than_current"]:
        lines.append(f"WORSE THAN TODAY: the suggestion pads {_pct(sug['padding_ratio'])}, the current buckets "
                     f"{_pct(cur['padding_ratio'])}; --write refuses it without --force")
    notes = []
    if cur["chunked"]:
        notes.append(f"{cur['chunked']:,} requests run in batch chunks with the current buckets")
    if cur["truncated"]:
        notes.append(f"{cur['truncated']:,} requests cut to the largest current bucket (truncate = true)")
    if out["overflow_calls"]:
        notes.append(f"{out['overflow_calls']:,} calls beyond the recorders' shape cap are not in the counts")
    if out["other_dims"]:
        notes.append("NEFFs are over the searched dims; times " + " x ".join(
            f"{len(v)} ({d})" for d, v in out["other_dims"].items()) + " for the dims left as they are")
    lines += [f"note: {n}" for n in notes]
    lines.append("")
    lines.append("NEFFs  padding    the last NEFF buys  buckets")
    for r in out["curve"]:
        gain = "" if r["gain"] is None else f"-{100 * r['gain']:.2f} points"
        lines.append(f"{r['budget']:<5}  {_pct(r['padding_ratio']):<9}  {gain:<18}  {_fmt_buckets(r['buckets'])}"
                     + ("" if r["method"] == "exact" else f"  ({r['method']})"))
    if len(out["curve"]) < out["max_buckets"]:
        lines.append(f"(more NEFFs than {len(out['curve'])} cannot lower the padding: every value has its own bucket)")
    return "\n".join(lines)


def format_written(w: dict) -> str:
    """The text of ``--write``: what changed in the file and the targets added, kept and removed."""
    name = Path(w["file"]).name
    if not w["changed"]:
        return f"{name} already holds these buckets; nothing written"
    lines = [f"wrote {w['file']}: " + ", ".join(f"{d} = {v} (was {w['was'][d]})" for d, v in w["buckets"].items()),
             f"plan: {len(w['added'])} added, {len(w['kept'])} kept, {len(w['removed'])} no longer in the matrix"]
    lines += [f"  + {t}" for t in w["added"]] + [f"  = {t}" for t in w["kept"]] + [f"  - {t}" for t in w["removed"]]
    lines.append("next: `neuron-build build` compiles the added targets (and kept ones never built); the artifacts "
                 "of removed ones stay in the store until `neuron-build gc`")
    display_note(f"edited {name} in place; comments and layout kept")
    return "\n".join(lines)


__all__ = ["format_suggestion", "format_written", "register"]
