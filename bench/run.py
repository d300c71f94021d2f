"""``make bench``: every benchmark in one run, the targets checked, plots drawn for docs/benchmarks.md.

    .venv/bin/python bench/run.py                  # full run (~12 minutes on 2 cores)
    .venv/bin/python bench/run.py --quick          # small corpora, short runs (checks the scripts)
    .venv/bin/python bench/run.py --report         # re-print and re-plot from the saved results
    .venv/bin/python bench/run.py --update         # write bench/results and docs/img in the checkout
    make bench ARGS="--only throughput"

Results and plots go to ``$FEEDLINE_BENCH_OUT`` (default ``/tmp/feedline-bench/results``) so a
trial run never overwrites the committed ones; ``--update`` writes those.

Parts: ``throughput`` (tokens/s and CPU s per M tokens, CLM packed at 1024 on documents and on
short records, MLM at 128, every contender, each a ratio to the raw ``tokenizers`` encoder run
interleaved with it, medians of three; the peers run once), ``startup`` (time to first batch, 1 GB), ``memory`` (peak
RSS, 100 MB vs 1 GB), ``service`` (``bench/service.py``: one vs eight clients of one server),
``profile`` (CPU by thread, ``bench/cpu_profile.py``), and, when their scripts are present,
``backends`` (``bench/backends.py``: tokenizer backends), ``pretokenized``
(``bench/pretokenized.py``: pre-tokenized sources against LitData) and ``partitions``
(``bench/partitions.py --cpu``: CPU per token of worker processes against in-process, the composer's CPU per step). Each part writes its own JSON under
``bench/results/``; this script then prints the targets (issues 8 and 15) as ratios from the same
run and draws ``docs/img/bench_*.png``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import memory
import startup
import throughput
from common import IMG, RESULTS, ROOT, bar_plot, load_json, machine, save_json, table

MODULES = {"throughput": throughput, "startup": startup, "memory": memory}
PROFILE_COLUMNS = [("thread", "thread", ""), ("cpu_s", "CPU s", ".2f"), ("s_per_mtok", "CPU s / M tok", ".3f"),
                   ("share", "share", ".1%")]

PARTS = ("throughput", "startup", "memory", "service", "profile", "backends", "pretokenized", "partitions")
PROFILED = ("clm-1024", "clm-1024-short", "mlm-128")
#: Scripts run as their own processes (a failing one never stops the run), with their arguments for a full and a
#: quick run; each saves its own JSON (``<part>.json``), and its printed table is kept beside it (``<part>-run.json``).
OPTIONAL_SCRIPTS: dict[str, tuple[str, list[str], list[str]]] = {
    "backends": ("backends.py", [], ["--mb", "2", "--rounds", "1"]),
    "pretokenized": ("pretokenized.py", ["--rounds", "2", "--seconds", "6"], ["--quick"]),
    "partitions": ("partitions.py",
                   ["--cpu", "--k", "0,1,8,14", "--rounds", "2", "--warmup", "8", "--seconds", "6",
                    "--workloads", "clm-short,clm-docs"],
                   ["--cpu", "--k", "0,1", "--rounds", "1", "--warmup", "2", "--seconds", "2", "--mb", "8",
                    "--workloads", "clm-short"]),
}
WORKLOADS = "clm-1024,clm-1024-short,mlm-128"
FULL = {"throughput": ["--mb", "512", "--seconds", "8", "--rounds", "3", "--workloads", WORKLOADS],
        "startup": ["--offline-mb", "24"], "memory": ["--seconds", "8"]}
QUICK = {"throughput": ["--mb", "32", "--seconds", "4", "--workloads", WORKLOADS], "startup": ["--mb", "32", "--offline-mb", "8"],
         "memory": ["--small-mb", "8", "--large-mb", "32", "--seconds", "3"]}


def run_service(quick: bool) -> None:
    """Run bench/service.py (owned by the service work) and keep its printed table."""
    script = ROOT / "bench" / "service.py"
    if not script.exists():
        return
    cmd = [sys.executable, str(script)] + (["--epochs", "1"] if quick else [])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=throughput.child_env())
    print(proc.stdout)
    save_json("service", {"machine": machine(), "command": "python bench/service.py" + (" --epochs 1" if quick else ""),
                          "returncode": proc.returncode, "stdout": proc.stdout, "stderr_tail": proc.stderr[-2000:],
                          "wall_s": time.perf_counter() - t0})


def run_optional(part: str, quick: bool) -> None:
    """Run ``bench/<script>`` in its own process; a missing or failing script never stops the run."""
    name, full, short = OPTIONAL_SCRIPTS[part]
    script = ROOT / "bench" / name
    if not script.exists():
        print(f"  ({script.name} is not in this checkout: skipped)")
        return
    cmd = [sys.executable, str(script), *(short if quick else full)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=throughput.child_env())
        out, err, code = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        out, err, code = str(e.stdout or ""), "timed out after 900 s", -1
    print(out)
    save_json(f"{part}-run", {"machine": machine(), "command": "python " + " ".join(cmd[1:]).replace(str(ROOT) + "/", ""),
                     "returncode": code, "stdout": out, "stderr_tail": err[-2000:], "wall_s": time.perf_counter() - t0})


def rate(rows: list[dict[str, Any]], name: str) -> float | None:
    return next((r.get("tokens_per_s") for r in rows if r.get("contender") == name), None)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def targets() -> list[dict[str, Any]]:
    """The throughput targets (issues 8 and 15) against the saved results of this run."""
    out: list[dict[str, Any]] = []
    workloads = (load_json("throughput") or {}).get("workloads", {})
    tp = workloads.get("clm-1024", [])
    short = workloads.get("clm-1024-short", [])
    mlm = workloads.get("mlm-128", [])

    def check(name: str, value: float | None, goal: str, ok: bool | None) -> None:
        out.append({"target": name, "value": value, "goal": goal,
                    "met": "n/a" if value is None or ok is None else ("yes" if ok else "NO")})

    ratios = [  # (target, the workload's rows, numerator, denominator, goal)
        ("in-process / raw tokenizer (clm 1024, documents)", tp, "feedline", "raw", 3.0),
        ("in-process / raw tokenizer (clm 1024, short records)", short, "feedline", "raw", 3.0),
        ("service / in-process (clm 1024, documents)", tp, "feedline-service", "feedline", 0.9),
        ("service / in-process (clm 1024, short records)", short, "feedline-service", "feedline", 0.9),
        ("in-process / raw tokenizer (mlm 128, BERT)", mlm, "feedline", "raw", 0.9),
        ("feedline / HF streaming + DataLoader", tp, "feedline", "hf-stream", 2.0),
        ("feedline / Ray Data", tp, "feedline", "ray-data", 2.0),
    ]
    for name, rows, num, den, goal in ratios:
        v = ratio(rate(rows, num), rate(rows, den))
        check(name, v, f">= {goal:g}", v is not None and v >= goal)
    hf_only = ratio(rate(mlm, "feedline-hf"), rate(mlm, "raw"))  # shown beside it: tokenizers alone, no word cache
    check("in-process / raw tokenizer (mlm 128, BERT, backend: hf)", hf_only, "(shown)", None)
    pretok = load_json("pretokenized") or {}
    for docs, name, goal in (("short", "flat-concat", 1.0), ("long", "flat-concat", 1.0), ("short", "flat-pack", 0.5),
                             ("short", "parquet-pack", 0.5), ("long", "flat-pack", 1.0), ("long", "megatron-pack", 1.0),
                             ("long", "arrow-pack", 1.0), ("long", "parquet-pack", 1.0)):
        rows = pretok.get(docs, {}).get("rows", [])
        v = ratio(rate(rows, name), rate(rows, "litdata"))
        check(f"pre-tokenized {name} / LitData in-process, {docs} documents", v, f">= {goal:g}",
              v is not None and v >= goal)
    same = (load_json("backends") or {}).get("identical")
    check("batches, backend auto vs hf (1 = identical)", None if same is None else float(same), "identical",
          None if same is None else bool(same))
    st = load_json("startup") or {}
    fb = next((r.get("first_batch_s") for r in st.get("rows", []) if r.get("contender") == "feedline"), None)
    check(f"first batch, {st.get('corpus_mb', 0):.0f} MB corpus (s)", fb, "<= 0.5", fb is not None and fb <= 0.5)
    mem = load_json("memory") or {}
    d = next((r.get("delta_mb") for r in mem.get("rows", []) if r.get("contender") == "feedline"), None)
    check("loader RSS, large minus small corpus (MB)", d, "<= 50", d is not None and d <= 50)
    return out


def plots() -> list[Path]:
    paths = []
    tp = load_json("throughput") or {}
    for wl, rows in tp.get("workloads", {}).items():
        ok = [r for r in rows if "error" not in r]
        paths.append(bar_plot(f"bench_throughput_{wl.replace('-', '')}", [r["label"] for r in ok],
                              [r.get("tokens_per_s") for r in ok], title=f"tokens/s delivered to the consumer, {wl}",
                              xlabel="tokens/s (higher is better, log scale)", log=True,
                              highlight=[r["label"] for r in ok if r["contender"].startswith("feedline")],
                              second=("steady (after the first batch)", "end to end (start-up and conversion included)",
                                      [r.get("e2e_tokens_per_s") for r in ok]),
                              note=f"{tp['machine']['cores']} cores, load {tp['machine']['load_avg_1m']:.2f}; {tp['corpus']['mb']:g} MB real text, repeated"))
        paths.append(bar_plot(f"bench_cpu_{wl.replace('-', '')}", [r["label"] for r in ok],
                              [r.get("cpu_s_per_mtok") for r in ok], title=f"CPU seconds per million tokens, {wl}",
                              xlabel="CPU s / M tokens, whole process tree (lower is better)",
                              highlight=[r["label"] for r in ok if r["contender"].startswith("feedline")]))
    st = load_json("startup") or {}
    ok = [r for r in st.get("rows", []) if r.get("at_1gb_s") is not None]
    if ok:
        paths.append(bar_plot("bench_first_batch", [r["label"] for r in ok], [r["at_1gb_s"] for r in ok],
                              title=f"time to first batch, {st['corpus_mb']:.0f} MB corpus (offline ones scaled from "
                                    f"{st['offline_corpus_mb']:.0f} MB)", xlabel="seconds (lower is better, log scale)",
                              highlight=[r["label"] for r in ok if r["contender"].startswith("feedline")], log=True))
    mem = load_json("memory") or {}
    ok = [r for r in mem.get("rows", []) if r.get("small_mb") and r.get("large_mb")]
    if ok:
        sizes = mem["corpus_mb"]
        labels, values = [], []
        for r in ok:
            labels += [f"{r['label']} @ {sizes['small']:.0f} MB", f"{r['label']} @ {sizes['large']:.0f} MB"]
            values += [r["small_mb"], r["large_mb"]]
        paths.append(bar_plot("bench_memory", labels, values, title="peak RSS of the loader's process tree",
                              xlabel="MB (lower is better)", highlight=[x for x in labels if x.startswith("feedline")]))
    return paths


def report() -> str:
    """Print every saved table and the targets; also written to ``bench/results/report.md``."""
    parts: list[str] = []
    for part in ("throughput", "startup", "memory"):
        data = load_json(part)
        if not data:
            continue
        m = data["machine"]
        head = f"{m['cores']} cores ({m['cpu']}), load average {m['load_avg_1m']:.2f} at start, {m['date']}"
        if part == "throughput":
            after = data.get("load_avg_after")
            for wl, rows in data["workloads"].items():
                note = data.get("corpora", {}).get(wl, {}).get("note", data["corpus"].get("note", ""))
                parts.append(f"### throughput {wl}\n\n{head}" + (f", {after:.2f} at the end" if after is not None else "")
                             + f"; {data['corpus']['mb']:g} MB corpus: {note}; ratios against the raw encoder of the "
                             "same run (contenders interleaved, median of the rounds)\n\n" + table(rows, throughput.COLUMNS))
        else:
            parts.append(f"### {part}\n\n{head}\n\n" + table(data["rows"], MODULES[part].COLUMNS))
    for wl in PROFILED:
        prof = load_json(f"profile-{wl}")
        if prof:
            parts.append(f"### CPU by thread, feedline in-process, {wl}\n\n{prof['tokens']:,} tokens in {prof['wall_s']:.1f} s, "
                         f"load average {prof['machine']['load_avg_1m']:.2f} at the end\n\n" + table(prof["rows"], PROFILE_COLUMNS))
    for name in ("service", *OPTIONAL_SCRIPTS):
        data = load_json(name if name == "service" else f"{name}-run")
        if data and data.get("stdout"):
            script = OPTIONAL_SCRIPTS[name][0] if name in OPTIONAL_SCRIPTS else "service.py"
            parts.append(f"### {name} (bench/{script})\n\n```\n" + data["stdout"].strip() + "\n```")
    parts.append("### targets (ratios from the same run)\n\n" + table(targets(), [
        ("target", "target", ""), ("value", "value", ".3g"), ("goal", "goal", ""), ("met", "met", "")]))
    text = "\n\n".join(parts) + "\n"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "report.md").write_text(text)
    print("\n" + text)
    print("plots: " + ", ".join(p.name for p in plots()) + f" (in {IMG})")
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small corpora and short runs, to check the scripts")
    ap.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts of {PARTS}")
    ap.add_argument("--report", action="store_true", help="only print the saved results and redraw the plots")
    ap.add_argument("--update", action="store_true",
                    help="write results and plots into the checkout (bench/results, docs/img) instead of "
                         f"{RESULTS}")
    args = ap.parse_args(argv)
    if args.update and os.environ.get("FEEDLINE_BENCH_OUT") != "commit":
        os.environ["FEEDLINE_BENCH_OUT"] = "commit"  # the scripts' processes and this one, restarted below
        os.execv(sys.executable, [sys.executable, *sys.argv])
    print(f"results and plots go to {RESULTS}" + ("" if args.update else " (--update writes the committed ones)"))
    if not args.report:
        load = os.getloadavg()[0]
        print(f"load average {load:.2f} on {os.cpu_count()} cores" + ("  (busy machine: figures will be noisy)" if load > 1 else ""))
        sizes = QUICK if args.quick else FULL
        for part in args.only.split(","):
            print(f"\n=== {part}", flush=True)
            if part == "service":
                run_service(args.quick)
            elif part in OPTIONAL_SCRIPTS:
                run_optional(part, args.quick)
            elif part == "profile":
                for wl in PROFILED:  # a fresh process each: thread CPU times are cumulative
                    subprocess.run([sys.executable, str(ROOT / "bench" / "cpu_profile.py"), "--workload", wl,
                                    "--seconds", "4" if args.quick else "6"], check=False, env=throughput.child_env())
            else:
                MODULES[part].main(sizes[part])
        save_json("summary", {"machine": machine(), "targets": targets(), "quick": args.quick})
    report()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
