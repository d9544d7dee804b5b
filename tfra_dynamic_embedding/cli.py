"""`tfra-de`: one command line for the whole job.

    tfra-de plan --pool 80 --devices 8 --memory 16GiB --strategy lookup-greedy --out plan.json
    tfra-de plan --tables tables.json --devices 4 --out plan.json --plot plan.png
    tfra-de evaluate --pool 856 --tasks 10 --strategies all --plot strategies.png
    tfra-de evaluate --plan plan.json              # re-score a (hand-edited) plan
    tfra-de workloads generate --tables 856 --out pool/ --split --tasks 10
    tfra-de workloads import --criteo day_0.tsv --out criteo_tables.json
    tfra-de server --cluster cluster.json --job ps --task 0   # a PS with the kernels loaded
    tfra-de capacity --rows 1e10 --dim 64 --optimizer adam --ps 8,16,32   # PS sizing

Adding a subcommand: write `add_parser(subparsers)` in any module -- it creates its parser with
`subparsers.add_parser(name, help=...)`, sets `parser.set_defaults(run=fn)` where
`fn(args) -> exit code`, and imports nothing heavy (TensorFlow belongs inside `fn`) -- then
list it in `SUBCOMMANDS`. Placement commands never import TensorFlow themselves.
"""

import argparse
import importlib
import json
import os
import sys

# name -> "module:function" adding the subcommand's parser (see the module docstring).
SUBCOMMANDS = {
    "plan": "tfra_dynamic_embedding.cli:add_plan_parser",
    "evaluate": "tfra_dynamic_embedding.cli:add_evaluate_parser",
    "workloads": "tfra_dynamic_embedding.cli:add_workloads_parser",
    "demo": "tfra_dynamic_embedding.demo.run:add_parser",
    "benchmark": "tfra_dynamic_embedding.placement.benchmark.collect:add_parser",
    "train-planner": "tfra_dynamic_embedding.placement.train:add_parser",
    "server": "tfra_dynamic_embedding.distributed.server:add_parser",
    "serve": "tfra_dynamic_embedding.inference.serve:add_parser",
    "export": "tfra_dynamic_embedding.inference.export_command:add_parser",
    "capacity": "tfra_dynamic_embedding.distributed.capacity:add_parser",
}


class CliError(Exception):
    """A user mistake: printed as `tfra-de: error: ...`, exit code 2."""


def build_parser():
    parser = argparse.ArgumentParser(
        prog="tfra-de", description="tfra_dynamic_embedding tools: plan where embedding tables "
        "live, compare placement strategies, generate workloads, run the training demo.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, target in SUBCOMMANDS.items():
        module, function = target.split(":")
        getattr(importlib.import_module(module), function)(subparsers)
    return parser


def main(argv=None):
    """Entry point of the `tfra-de` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except CliError as error:
        print(f"tfra-de: error: {error}", file=sys.stderr)
        return 2
    except (ValueError, KeyError, ImportError, OSError) as error:
        print(f"tfra-de {args.command}: {type(error).__name__}: {error}", file=sys.stderr)
        return 1


# -- shared options ------------------------------------------------------------------------------
def _add_source_options(parser, pool_default=None):
    group = parser.add_argument_group("tables (one source)")
    src = group.add_mutually_exclusive_group()
    src.add_argument("--tables", metavar="FILE", help="table list: JSON ({'tables': [...]} or a "
                     "list), CSV (name,rows,dim,...), or a task/plan file")
    src.add_argument("--pool", type=int, metavar="N", default=pool_default,
                     help="generate a MetaSyn-like pool of N tables")
    src.add_argument("--dlrm", metavar="FILE.pt", help="a dlrm_datasets .pt file (needs torch)")
    src.add_argument("--criteo", metavar="FILE.tsv", help="a Criteo TSV: one table per C1..C26")
    group.add_argument("--seed", type=int, default=0, help="seed of pools, tasks, random plans")
    group.add_argument("--dims", default="16,32,64,128",
                       help="dims drawn for --pool, or the one dim of --dlrm/--criteo tables")
    group.add_argument("--batch-size", type=int, default=65536, help="training batch size")
    group.add_argument("--max-lines", type=int, default=None, help="--criteo: lines to read")
    dev = parser.add_argument_group("devices")
    dev.add_argument("--devices", type=int, default=8, help="number of devices / PS tasks")
    dev.add_argument("--memory", default=None,
                     help="memory per device for tables, e.g. 16GiB (default: unlimited)")
    dev.add_argument("--device-template", default="/job:ps/task:{i}",
                     help="device names, {i} is the index (e.g. /GPU:{i})")


def _dims(text):
    try:
        dims = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError as error:
        raise CliError(f"--dims must be comma-separated ints; got {text!r}") from error
    if not dims or min(dims) < 1:
        raise CliError(f"--dims must be positive ints; got {text!r}")
    return dims


def _load_tables(args):
    from tfra_dynamic_embedding.placement import loaders, workloads  # pylint: disable=import-outside-toplevel
    if args.tables:
        return loaders.load_tables(args.tables)
    if args.dlrm:
        return loaders.load_dlrm_pt(args.dlrm, dim=_dims(args.dims)[0])
    if args.criteo:
        return loaders.criteo_tsv_stats(args.criteo, dim=_dims(args.dims)[0],
                                        batch_size=args.batch_size, max_lines=args.max_lines)
    if args.pool:
        return workloads.generate_pool(args.pool, seed=args.seed, dims=_dims(args.dims),
                                       batch_size=args.batch_size)
    raise CliError("give the tables: --tables FILE, --pool N, --dlrm FILE or --criteo FILE")


def _make_task(args, tables):
    from tfra_dynamic_embedding.placement import types  # pylint: disable=import-outside-toplevel
    if "{i}" not in args.device_template:
        raise CliError(f"--device-template must contain {{i}}; got {args.device_template!r}")
    devices = types.make_devices(args.devices, args.memory, args.device_template)
    return types.Task(tables, devices, batch_size=args.batch_size)


def _print_report(plan, report, scale=1e3):
    from tfra_dynamic_embedding.placement.types import format_bytes  # pylint: disable=import-outside-toplevel
    counts = {}
    for shard in plan.shards():
        counts[shard.device] = counts.get(shard.device, 0) + 1
    print(f"strategy {plan.strategy}, estimator {report.estimator}, "
          f"{len(plan.task.tables)} tables on {plan.task.num_devices} devices")
    width = max(len(d.name) for d in plan.task.devices)
    for device in plan.task.devices:
        limit = "" if device.memory_bytes is None else f" / {format_bytes(device.memory_bytes)}"
        print(f"  {device.name:<{width}}  {counts.get(device.name, 0):4d} shards  "
              f"{format_bytes(report.memory[device.name]):>10}{limit}  "
              f"cost {report.device_costs[device.name] * scale:9.3f} ms")
    line = f"max cost {report.max_cost * scale:.3f} ms, balance {report.balance:.3f}"
    if report.speedup_over_random:
        line += f", speedup over random {report.speedup_over_random:.3f}x"
    if report.gap is not None:
        line += f", lower bound {report.lower_bound * scale:.3f} ms (gap {report.gap:.1%})"
    print(line)
    rows = [f"{name} ({len(devices)} slices)" for name, devices in plan.assignment.items()
            if len(devices) > 1 and name not in plan.columns]
    if rows:
        print("cut by rows (plan.scope() gives de.get_variable their devices): " + ", ".join(rows))
    if plan.columns:
        print("cut by columns (build them with placement.column_split): " + ", ".join(
            f"{name} (widths {widths})" for name, widths in plan.columns.items()))


# -- plan ------------------------------------------------------------------------------------------
def add_plan_parser(subparsers):
    parser = subparsers.add_parser(
        "plan", help="place tables on devices with one strategy, write plan.json",
        description="Place embedding tables on devices and write a plan that `plan.scope()` / "
        "`apply` use. Example: tfra-de plan --pool 80 --devices 8 --memory 16GiB "
        "--strategy lookup-greedy --out plan.json --plot plan.png")
    _add_source_options(parser)
    parser.add_argument("--strategy", default="best",
                        help="placement strategy (see `tfra-de evaluate --list`); default "
                        "'best': every strategy (the learned RL policy included) proposes, "
                        "the estimator scores, the cheapest plan wins")
    parser.add_argument("--weights", metavar="DIR", default=None,
                        help="--strategy learned: cost_model_{cpu,gpu}.npz / "
                        "policy_{cpu,gpu}.npz from `tfra-de train-planner --out DIR` (gpu for "
                        "tasks on GPUs, cpu where DIR has no gpu files; default: the shipped "
                        "weights)")
    parser.add_argument("--estimator", default=None,
                        help="cost estimator that scores the candidates and the report (default: "
                        "learned, the cost model of the task's profile; analytic where "
                        "--weights holds none)")
    parser.add_argument("--verify-top", type=int, default=0, metavar="K",
                        help="--strategy best: measure the K cheapest distinct plans together "
                        "(--verify-estimator) and keep the cheapest measured one (0: off)")
    parser.add_argument("--verify-estimator", default=None,
                        help="estimator of --verify-top (default: measured-gpu, PyTorch kernels "
                        "on this machine's GPU, for tasks on GPUs; measured-cpu, TF benchmarks, "
                        "otherwise)")
    parser.add_argument("--random", type=int, default=10, metavar="K",
                        help="random plans for the speedup figure (0: skip)")
    parser.add_argument("--out", required=True, help="plan JSON to write")
    parser.add_argument("--plot", help="PNG of per-device stacked costs")
    parser.set_defaults(run=_run_plan)
    return parser


def _run_plan(args):
    from tfra_dynamic_embedding.placement import evaluate, proposers  # pylint: disable=import-outside-toplevel
    from tfra_dynamic_embedding.placement.planner import Planner  # pylint: disable=import-outside-toplevel
    if args.strategy != "best" and args.strategy not in proposers.list_strategies():
        raise CliError(f"--strategy must be 'best' or one of {proposers.list_strategies()}; "
                       f"got {args.strategy!r}")
    if args.verify_top < 0:
        raise CliError(f"--verify-top must be >= 0; got {args.verify_top}")
    if args.verify_top and args.strategy != "best":
        raise CliError(f"--verify-top needs --strategy best; got --strategy {args.strategy}")
    planner = Planner(args.estimator or None, None if args.strategy == "best" else [args.strategy],
                      weights=args.weights,
                      verifier=(args.verify_estimator or None) if args.verify_top else None,
                      verify_top=args.verify_top)
    task = _make_task(args, _load_tables(args))
    choice = planner.plan(task, seed=args.seed)
    for note in choice.notes:
        print(note)
    if args.strategy == "best":
        _print_candidates(choice, args.verify_top)
    plan = choice.plan
    # the report scores the plan as the choice did
    report = evaluate.evaluate_plan(plan, choice.judge, num_random=args.random, seed=args.seed)
    plan.save(args.out)
    _print_report(plan, report)
    print(f"wrote {args.out}")
    if args.plot:
        evaluate.plot_plan(plan, report, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _print_candidates(choice, verify_top):
    best_cost = min(c.max_cost for c in choice.candidates if c.max_cost is not None)
    for candidate in choice.candidates:
        cost = ("failed: " + candidate.error if candidate.max_cost is None
                else f"max cost {candidate.max_cost * 1e3:.3f} ms"
                + (f" (+{candidate.max_cost / best_cost - 1:.1%})" if best_cost else ""))
        if candidate.verified_cost is not None:
            cost += f", {choice.verified_by} {candidate.verified_cost * 1e3:.3f} ms"
        print(f"  candidate {candidate.strategy:<20s} {cost}")
    margin = ("" if choice.margin is None else ", tied with the runner-up"
              if choice.margin == 0 else f", {choice.margin:.1%} below the runner-up")
    judged_by = (f"the {choice.verified_by} estimator of the {verify_top} cheapest by "
                 f"the {choice.estimator} estimator" if choice.verified_by
                 else f"the {choice.estimator} estimator")
    print(f"best: {choice.plan.strategy} (by {judged_by}{margin})")


# -- evaluate --------------------------------------------------------------------------------------
def add_evaluate_parser(subparsers):
    parser = subparsers.add_parser(
        "evaluate", help="compare strategies on tasks (table + PNG), or re-score a plan",
        description="Compare placement strategies (strategies x metrics), averaged over tasks. "
        "Example: tfra-de evaluate --pool 856 --tasks 10 --tables-per-task 80 --devices 8 "
        "--strategies all --plot strategies.png")
    _add_source_options(parser)
    parser.add_argument("--task", action="append", metavar="TASK.json",
                        help="task file(s) written by `workloads generate --tasks` (repeatable)")
    parser.add_argument("--plan", metavar="PLAN.json", help="re-score this plan instead")
    parser.add_argument("--tasks", type=int, default=1,
                        help="with table sources: number of random tasks to draw")
    parser.add_argument("--tables-per-task", type=int, default=None,
                        help="tables per drawn task (default: all tables, one task)")
    parser.add_argument("--strategies", default="all", help="'all' or a comma-separated list")
    parser.add_argument("--estimator", default="analytic", help="cost estimator")
    parser.add_argument("--random", type=int, default=10, metavar="K",
                        help="random plans per task for the speedup (0: skip)")
    parser.add_argument("--plot", help="PNG: strategy comparison (default strategies.png), or "
                        "with --plan the plan's cost bars")
    parser.add_argument("--no-plot", action="store_true", help="write no PNG")
    parser.add_argument("--json", dest="json_out", help="write the rows as JSON")
    parser.add_argument("--out", help="with --plan: write the plan back with its costs")
    parser.add_argument("--list", action="store_true", help="list strategies and estimators")
    parser.set_defaults(run=_run_evaluate)
    return parser


def _run_evaluate(args):
    from tfra_dynamic_embedding.placement import (estimators, evaluate, proposers, types,  # pylint: disable=import-outside-toplevel
                                                  workloads)
    if args.list:
        for name in proposers.list_strategies():
            print(f"{name:20s} {proposers.describe_strategy(name)}")
        print("estimators: " + ", ".join(estimators.list_estimators()))
        return 0
    if args.plan:
        plan = types.Plan.load(args.plan)
        plan.validate()
        report = evaluate.evaluate_plan(plan, args.estimator, num_random=args.random,
                                        seed=args.seed)
        _print_report(plan, report)
        if args.out:
            plan.save(args.out)
            print(f"wrote {args.out}")
        if args.plot and not args.no_plot:
            evaluate.plot_plan(plan, report, args.plot)
            print(f"wrote {args.plot}")
        return 0
    if args.task:
        tasks = [types.Task.load(path) for path in args.task]
    else:
        task = _make_task(args, _load_tables(args))
        per_task = args.tables_per_task or len(task.tables)
        if args.tasks == 1 and per_task == len(task.tables):
            tasks = [task]
        else:
            tasks = workloads.make_tasks(task.tables, args.tasks, per_task, args.devices,
                                         args.memory, args.seed, args.batch_size,
                                         args.device_template)
    strategies = "all" if args.strategies == "all" else [
        s.strip() for s in args.strategies.split(",") if s.strip()]
    known = proposers.list_strategies()
    if strategies != "all" and any(s not in known for s in strategies):
        raise CliError(f"--strategies must be 'all' or names from {known}; "
                       f"got {args.strategies!r}")
    rows, _ = evaluate.compare_strategies(tasks, strategies, args.estimator, args.random,
                                          args.seed)
    print(f"{len(tasks)} task(s), {len(tasks[0].tables)} tables on {tasks[0].num_devices} "
          f"devices, estimator {args.estimator}")
    print(evaluate.format_rows(rows))
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
        print(f"wrote {args.json_out}")
    if not args.no_plot:
        path = args.plot or "strategies.png"
        evaluate.plot_comparison(rows, path, title=f"{len(tasks)} task(s), "
                                 f"{len(tasks[0].tables)} tables, {tasks[0].num_devices} devices")
        print(f"wrote {path}")
    return 0


# -- workloads ------------------------------------------------------------------------------------
def add_workloads_parser(subparsers):
    parser = subparsers.add_parser("workloads", help="generate table pools / import real ones",
                                   description="Generate a MetaSyn-like table pool, or import "
                                   "table statistics from dlrm_datasets or Criteo files.")
    sub = parser.add_subparsers(dest="workloads_command", metavar="ACTION")
    gen = sub.add_parser("generate", help="a calibrated synthetic pool (tables.json + more)",
                         description="Example: tfra-de workloads generate --tables 856 --out "
                         "pool/ --split --tasks 10 --devices 8 --memory 16GiB")
    gen.add_argument("--tables", type=int, default=856, help="number of tables")
    gen.add_argument("--out", required=True, help="output folder")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--dims", default="16,32,64,128", help="dims drawn uniformly")
    gen.add_argument("--batch-size", type=int, default=65536)
    gen.add_argument("--row-scale", type=float, default=1.0,
                     help="shrink hash sizes (CPU variants, e.g. 0.0625 with --batch-size 4096)")
    gen.add_argument("--groups", type=int, default=0, help="network tags net0.. for nsbp")
    gen.add_argument("--split", action="store_true", help="also write train.json / test.json")
    gen.add_argument("--tasks", type=int, default=0, help="also write K tasks (from test half "
                     "with --split)")
    gen.add_argument("--tables-per-task", type=int, default=80)
    gen.add_argument("--devices", type=int, default=8)
    gen.add_argument("--memory", default=None, help="memory per device of the tasks")
    gen.add_argument("--batches", type=int, default=0,
                     help="also write K batches of all tables (dlrm layout, .npz)")
    gen.set_defaults(run=_run_generate)
    imp = sub.add_parser("import", help="table statistics of real data as tables.json",
                         description="Example: tfra-de workloads import --criteo day_0.tsv "
                         "--max-lines 1000000 --batch-size 65536 --out criteo.json")
    src = imp.add_mutually_exclusive_group(required=True)
    src.add_argument("--dlrm", metavar="FILE.pt")
    src.add_argument("--criteo", metavar="FILE.tsv")
    imp.add_argument("--dim", type=int, default=16)
    imp.add_argument("--batch-size", type=int, default=65536)
    imp.add_argument("--max-lines", type=int, default=None)
    imp.add_argument("--out", required=True, help="tables JSON or CSV")
    imp.set_defaults(run=_run_import)
    parser.set_defaults(run=lambda args: parser.print_help() or 2)
    return parser


def _run_generate(args):
    import numpy as np  # pylint: disable=import-outside-toplevel
    from tfra_dynamic_embedding.placement import loaders, streams, workloads  # pylint: disable=import-outside-toplevel
    os.makedirs(args.out, exist_ok=True)
    pool = workloads.generate_pool(args.tables, seed=args.seed, dims=_dims(args.dims),
                                   batch_size=args.batch_size, row_scale=args.row_scale,
                                   num_groups=args.groups)
    written = [os.path.join(args.out, "tables.json")]
    loaders.save_tables(pool, written[0])
    stats = workloads.pool_statistics(pool, args.batch_size)
    stats["calibration"] = workloads.calibration_report(pool, args.batch_size)
    written.append(os.path.join(args.out, "summary.json"))
    with open(written[-1], "w", encoding="utf-8") as f:
        json.dump(stats, f, indent=1)
    source = pool
    if args.split:
        train, test = workloads.split_pool(pool, args.seed)
        for name, part in (("train.json", train), ("test.json", test)):
            written.append(os.path.join(args.out, name))
            loaders.save_tables(part, written[-1])
        source = test
    if args.tasks:
        os.makedirs(os.path.join(args.out, "tasks"), exist_ok=True)
        per_task = min(args.tables_per_task, len(source))
        for k, task in enumerate(workloads.make_tasks(source, args.tasks, per_task, args.devices,
                                                      args.memory, args.seed, args.batch_size)):
            written.append(os.path.join(args.out, "tasks", f"task{k:03d}.json"))
            task.save(written[-1])
    if args.batches:
        os.makedirs(os.path.join(args.out, "batches"), exist_ok=True)
        for k in range(args.batches):
            indices, offsets, lengths = streams.pool_batch(pool, k, args.batch_size)
            written.append(os.path.join(args.out, "batches", f"batch{k:03d}.npz"))
            np.savez_compressed(written[-1], indices=indices, offsets=offsets, lengths=lengths)
    cal = stats["calibration"]["lookups"]
    print(f"{len(pool)} tables: rows max {stats['rows_max']} mean {stats['rows_mean']:.0f} min "
          f"{stats['rows_min']}; pooling max {stats['pooling_max']:g} mean "
          f"{stats['pooling_mean']:.2f} min {stats['pooling_min']:g}; rank corr "
          f"{stats['rank_correlation_rows_pooling']:+.3f}")
    print(f"reuse histogram vs published 2021 (batch {args.batch_size}): max abs error "
          f"{cal['max_abs']:.4f}, L1 {cal['l1']:.4f}")
    print(f"wrote {len(written)} files under {args.out}")
    return 0


def _run_import(args):
    from tfra_dynamic_embedding.placement import loaders  # pylint: disable=import-outside-toplevel
    if args.dlrm:
        tables = loaders.load_dlrm_pt(args.dlrm, dim=args.dim)
    else:
        tables = loaders.criteo_tsv_stats(args.criteo, dim=args.dim, batch_size=args.batch_size,
                                          max_lines=args.max_lines)
    loaders.save_tables(tables, args.out)
    for t in tables[:30]:
        print(f"  {t.name:8s} rows {t.rows:>10d}  pooling {t.pooling_factor:8.3f}")
    print(f"wrote {len(tables)} tables to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
