"""``kiln-report <sweep dir>``: the tables and plots that compare a sweep's jobs.

Reads every job's ``bench.json`` (kiln-bench) and ``summary.json`` (kiln-train) below the
sweep directory and writes, next to them, ``report.md``, CSV tables and PNG plots, and
prints the tables:

- bench sweeps of PyTorch's suites: the seed's table form per suite (``bench_suites.csv``);
- bench sweeps: per (compile mode, precision) the geometric-mean speedup over passing
  models, the pass rate over all models, mean compile time and memory ratio
  (``bench_summary.csv``), a row per model (``bench_models.csv``), ``speedup.png``;
- training sweeps: final metrics, throughput, steady step time, FLOPs per step, achieved
  TFLOP/s, MFU, cold or warm compile, speedup against the eager run of the same sweep and
  scaling efficiency, each with an interval or marked noise (``train_runs.csv``),
  ``loss.png``, ``throughput.png``.

``--wandb`` also logs the tables and plots as one run in the sweep's W&B group.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kiln.experiments.report.bench import (
    MODEL_COLUMNS,
    SUITE_COLUMNS,
    SUMMARY_COLUMNS,
    model_rows,
    noisy_precisions,
    suite_rows,
    summary_rows,
)
from kiln.experiments.report.compile_issues import COMPILE_ISSUE_COLUMNS, compile_issue_rows
from kiln.experiments.report.load import load_sweep
from kiln.experiments.report.machine_panel import machine_markdown, machine_plot, machine_rows
from kiln.experiments.report.profiles import (
    ProfilePair,
    bench_profile_pairs,
    compact_line,
    profile_pairs,
    table_rows,
)
from kiln.experiments.report.profiles import markdown as profile_markdown
from kiln.experiments.report.render import (
    columns_of,
    machine_lines,
    markdown_table,
    write_csv,
)
from kiln.experiments.report.rows import RATIOS
from kiln.experiments.report.study import log_params, study_params, study_plots, study_rows
from kiln.experiments.report.terminal import print_header, print_tables
from kiln.experiments.report.train import (
    NOISE_RULE,
    loss_curves,
    noise_marked,
    run_name,
    train_rows,
)

TRAIN_METHOD = (
    "steady step time = median optimizer-step time after warm-up (kiln.core "
    "telemetry); speedup = eager run's step time / this run's, same resolved config; "
    f"MFU = achieved FLOP/s / the devices' peak (n/a where kiln knows no peak); {NOISE_RULE}"
)
_TRAIN_FIRST = [
    "run",
    "model",
    "precision",
    "compile_mode",
    "devices",
    "accumulate_grad_batches",
    "strategy",
    "activation_checkpointing",
    "status",
    "global_step",
    "train_loss",
]
_TRAIN_LAST = [
    "step_time_ms",
    "step_time_iqr_ms",
    "measured_steps",
    "samples_per_s",
    "tokens_per_s",
    "padding_fraction",
    "tokens_vs_unpacked",
    "flops_per_step",
    "achieved_tflops_per_s",
    "mfu",
    "mfu_na",
    "of_measured_peak",
    "of_measured_bandwidth",
    "compile_time_s",
    "compile_cache",
    "peak_memory_mb",
    "memory_rise_mb",
    "state_mb",
    "recompiles",
    "graph_breaks",
    *(column for names in RATIOS for column in names.all),
    "memory_vs_ddp",
    "state_vs_ddp",
    "error",
]
# in the CSV only: the printed tables fold them into the figure's cell
_CSV_ONLY = ("mfu_na", *(column for names in RATIOS for column in names.details))


def build_report(
    sweep_dir: str | Path, out_dir: str | Path | None = None, show: bool = True
) -> dict[str, Any]:
    """Write the report of ``sweep_dir`` (into ``out_dir``, default the sweep dir itself).

    Returns:
        ``{"files": [paths written], "tables": {name: (columns, rows)}, "plots": [pngs],
        "records": [all job records], "unreadable": ["<file>: <why>"]}``.
    """
    sweep = load_sweep(sweep_dir)
    out = Path(out_dir) if out_dir is not None else sweep.root
    out.mkdir(parents=True, exist_ok=True)
    records = sweep.bench + sweep.train
    md = [f"# kiln report: {sweep.root.resolve().name}", "", f"- Sweep: `{sweep.root.resolve()}`"]
    md += [f"- Machine: {line}" for line in machine_lines(records)]
    tables: dict[str, tuple[list[str], list[dict[str, Any]]]] = {}
    shown: dict[str, tuple[list[str], list[dict[str, Any]]]] = {}  # printed instead of tables
    plots: list[Path] = []
    files: list[Path] = []

    if sweep.bench:
        files_, plots_, lines = bench_section(sweep.bench, out, tables)
        files, plots, md = files + files_, plots + plots_, md + lines
    if sweep.train:
        files_, plots_, lines = train_section(sweep.train, out, tables, shown)
        files, plots, md = files + files_, plots + plots_, md + lines
    pairs = profile_pairs(sweep.train) + bench_profile_pairs(sweep.bench)
    if pairs:
        files_, plots_, lines = profile_section(pairs, out, tables)
        files, plots, md = files + files_, plots + plots_, md + lines
    files_, lines = compile_issues_section(records, out, tables)
    files, md = files + files_, md + lines
    changed = data_changed_lines(sweep.train)
    md += changed
    params = study_params(sweep.root, sweep.train) if sweep.train else []
    if params:
        files_, plots_, lines = study_section(sweep.train, params, out, tables)
        files, plots, md = files + files_, plots + plots_, md + lines
    if sweep.unreadable:
        md += ["", "## Unreadable job files", ""] + [f"- {u}" for u in sweep.unreadable]
    report_md = out / "report.md"
    report_md.write_text("\n".join(md) + "\n")
    files = [report_md, *files, *plots]

    if show:
        print_header(md[:8])
        print("\n".join(line for line in md if line.startswith("Intervals bootstrapped")))
        print_tables({**tables, **shown}, ", ".join(f.name for f in files if f.suffix != ".png"))
        for pair in pairs:
            print(compact_line(pair))
        if changed:
            print("\n".join(changed[1:]))
        print(f"wrote into {out}: {', '.join(f.name for f in files)}")
    return {
        "files": files,
        "tables": tables,
        "plots": plots,
        "records": records,
        "unreadable": sweep.unreadable,
    }


def train_section(
    records: list[dict[str, Any]],
    out: Path,
    tables: dict,
    shown: dict,
) -> tuple[list[Path], list[Path], list[str]]:
    """The training runs (``train_runs.csv``, the noise-marked table printed instead), loss
    curves, ratio and throughput plots; returns the files, the plots and the report's lines."""
    from kiln.experiments.report.plots import loss_plot, ratio_plots, throughput_bars

    files: list[Path] = []
    plots: list[Path] = []
    lines = [f"- Training method: {TRAIN_METHOD}"]  # once: the section does not repeat it
    rows = train_rows(records)
    metric_cols = [c for c in columns_of(rows) if c not in _TRAIN_FIRST + _TRAIN_LAST]
    columns = _TRAIN_FIRST + metric_cols + _TRAIN_LAST
    tables["train_runs"] = (columns, rows)
    files.append(write_csv(out / "train_runs.csv", rows, columns))
    shown_columns = [c for c in columns if c not in _CSV_ONLY]
    shown["train_runs"] = (shown_columns, noise_marked(rows))
    boots = sorted({str(r[n.bootstrap]) for r in rows for n in RATIOS if r.get(n.bootstrap)})
    said = f"Intervals bootstrapped {'; '.join(boots)}." if boots else ""
    lines += [
        "",
        "## Training runs",
        "",
        *([said, ""] if said else []),
        markdown_table(noise_marked(rows), shown_columns),
    ]
    if loss_curves(records):
        plots.append(loss_plot(records, out / "loss.png", "training loss"))
        lines += ["", "![loss](loss.png)"]
    for png in ratio_plots(rows, out):
        plots.append(png)
        lines += ["", f"![{png.stem}]({png.name})"]
    if any(r.get("samples_per_s") for r in rows):
        plots.append(throughput_bars(rows, out / "throughput.png", "throughput"))
        lines += ["", "![throughput](throughput.png)"]
    compared = compared_runs(records, rows)
    if machine_rows(compared):
        plots.append(machine_plot(compared, out / "machine.png"))
        lines += ["", *machine_markdown(machine_rows(compared))]
    return files, plots, lines


def compared_runs(
    records: list[dict[str, Any]], rows: list[dict[str, Any]]
) -> list[tuple[str, dict[str, Any]]]:
    """The runs a ratio compares (either side of a speedup or a scaling efficiency), named."""
    names = {
        r["run"]
        for r in rows
        if isinstance(r.get("speedup_vs_eager"), float)
        or isinstance(r.get("scaling_efficiency"), float)
    }
    return [(run_name(rec), rec) for rec in records if run_name(rec) in names]


def data_changed_lines(records: list[dict[str, Any]]) -> list[str]:
    """The report's lines for the attempts that resumed on changed data
    (``data.allow_changed=true``: the attempt's ``data_changed``); none without any."""
    lines = [
        f"- {run_name(record)}: resumed from step {attempt.get('from_step')} on changed data: "
        + "; ".join(attempt["data_changed"])
        for record in records
        for attempt in record.get("attempts") or []
        if attempt.get("data_changed")
    ]
    return ["", "## Data changed on resume", "", *lines] if lines else []


def bench_section(
    records: list[dict[str, Any]], out: Path, tables: dict
) -> tuple[list[Path], list[Path], list[str]]:
    """kiln-bench's speedup per compile mode and precision (``bench_summary.csv``), per model
    (``bench_models.csv``) and as bars (``speedup.png``); returns the files, the plots and
    the report's lines."""
    from kiln.experiments.report.plots import speedup_bars

    methods = sorted({str(r["method"]) for r in records if r.get("method")})
    rows = model_rows(records)
    summary = summary_rows(rows)
    files: list[Path] = []
    lines = [f"- Bench method: {m}" for m in methods]
    suites = suite_rows(summary)
    if suites:
        tables["bench_suites"] = (SUITE_COLUMNS, suites)
        files.append(write_csv(out / "bench_suites.csv", suites, SUITE_COLUMNS))
        lines += [
            "",
            "## PyTorch 2 suites (the seed's table form)",
            "",
            "Per suite and compile mode: geometric-mean speedup over the models that pass "
            "the accuracy check and pass rate over all, in FP32 (32-true) and AMP; mean "
            "compile time and geometric-mean memory ratio (compiled / eager) of the "
            "passing models.",
            "",
            markdown_table(suites, SUITE_COLUMNS),
        ]
    tables["bench_summary"] = (SUMMARY_COLUMNS, summary)
    tables["bench_models"] = (MODEL_COLUMNS, rows)
    files += [
        write_csv(out / "bench_summary.csv", summary, SUMMARY_COLUMNS),
        write_csv(out / "bench_models.csv", rows, MODEL_COLUMNS),
    ]
    noisy = list(noisy_precisions(rows))
    title = "torch.compile training speedup"
    plots = [speedup_bars(rows, out / "speedup.png", title, noisy=noisy)]
    lines += [
        "",
        "## torch.compile speedup per compile mode and precision",
        "",
        "Geometric-mean speedup and memory ratio over the models that pass the "
        "accuracy check; pass rate over all models.",
        "",
        markdown_table(summary, SUMMARY_COLUMNS),
        "",
        "## Per model",
        "",
        markdown_table(rows, MODEL_COLUMNS),
        "",
        "![speedup](speedup.png)",
    ]
    return files, plots, lines


def profile_section(
    pairs: list[ProfilePair], out: Path, tables: dict
) -> tuple[list[Path], list[Path], list[str]]:
    """The profiled runs side by side: ``profiles.csv``, a stacked-bar plot, the tables."""
    from kiln.experiments.report.plots import profile_bars

    columns = ["pair", "category", "base_ms", "other_ms"]
    rows = table_rows(pairs)
    tables["profiles"] = (columns, rows)
    files = [write_csv(out / "profiles.csv", rows, columns)]
    plot = profile_bars(pairs, out / "profiles.png")
    return files, [plot], [*profile_markdown(pairs), "", "![profiles](profiles.png)"]


def compile_issues_section(
    records: list[dict[str, Any]], out: Path, tables: dict
) -> tuple[list[Path], list[str]]:
    """The jobs with graph breaks or recompiles and their top reasons
    (``compile_issues.csv``); returns the files and the report's lines (none without any)."""
    issues = compile_issue_rows(records)
    if not issues:
        return [], []
    tables["compile_issues"] = (COMPILE_ISSUE_COLUMNS, issues)
    files = [write_csv(out / "compile_issues.csv", issues, COMPILE_ISSUE_COLUMNS)]
    return files, [
        "",
        "## Graph breaks and recompiles",
        "",
        "The jobs whose compiled code broke into several graphs or recompiled: the most "
        "frequent graph break (dynamo's reason and the user source line) and the first "
        "recompile (the function and the guard that failed).",
        "",
        markdown_table(issues, COMPILE_ISSUE_COLUMNS),
    ]


def study_section(
    records: list[dict[str, Any]], params: list[str], out: Path, tables: dict
) -> tuple[list[Path], list[Path], list[str]]:
    """An Optuna study's trials ranked (``study.csv``) and the metric against each parameter
    (``study_<param>.png``); returns the files, the plots and the report's lines."""
    from kiln.experiments.report.plots import scatter_plot

    metric, rows = study_rows(records, params)
    columns = ["rank", "run", *params, metric, "status"]
    tables["study"] = (columns, rows)
    files = [write_csv(out / "study.csv", rows, columns)]
    lines = ["", f"## Study: trials ranked by {metric}", "", markdown_table(rows, columns)]
    plots = []
    for spec in study_plots(rows, params, metric, log_params(out, records)):
        png = out / f"study_{spec['xlabel'].replace('.', '_')}.png"
        plots.append(scatter_plot(path=png, **spec))
        lines += ["", f"![{spec['xlabel']}]({png.name})"]
    return files, plots, lines


def main(argv: list[str] | None = None) -> int:
    """The ``kiln-report`` command."""
    from kiln.models.plugins import load_plugins

    load_plugins()  # a plugin's models and metrics, as kiln-train had them
    parser = argparse.ArgumentParser(
        prog="kiln-report", description="Compare the jobs of a kiln-bench or kiln-train sweep."
    )
    parser.add_argument("sweep_dir", help="a Hydra multirun directory (or one job's directory)")
    parser.add_argument("--out", default=None, help="where to write (default: the sweep dir)")
    parser.add_argument(
        "--wandb",
        action="store_true",
        help="also log the tables and plots as one run in the sweep's W&B group",
    )
    parser.add_argument(
        "--wandb-mode",
        default="offline",
        choices=["offline", "online"],
        help="W&B mode of that run (default: offline)",
    )
    parser.add_argument(
        "--wandb-project",
        default=None,
        help="W&B project (default: the one the jobs logged to, else kiln)",
    )
    parser.add_argument("--quiet", action="store_true", help="do not print the tables")
    args = parser.parse_args(argv)
    try:
        report = build_report(args.sweep_dir, args.out, show=not args.quiet)
    except FileNotFoundError as exc:
        print(f"kiln-report: {exc}", file=sys.stderr)
        return 2
    for unreadable in report["unreadable"]:  # left out of every table: say so, --quiet too
        print(f"kiln-report: left out an unreadable job file: {unreadable}", file=sys.stderr)
    if args.wandb:
        from kiln.experiments.report.wandb_run import log_report

        info = log_report(
            Path(args.out or args.sweep_dir),
            report["records"],
            report["tables"],
            report["plots"],
            mode=args.wandb_mode,
            project=args.wandb_project,
        )
        if info and not args.quiet:
            print(f"logged the report to W&B run {info['run_id']} ({info['dir']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
