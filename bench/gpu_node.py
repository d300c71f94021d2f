"""One script for a GPU node: the scaling curve on its cores and the GPU's data-wait share, in < 5 minutes.

    python bench/gpu_node.py                          # the node: CUDA, BERT-base and GPT-2 small
    python bench/gpu_node.py --wheels /path/to/wheels # first install pyzmq/zstandard/fastokens from wheels
    python bench/gpu_node.py --quick                  # anywhere (CPU): tiny models, few steps, short windows
    python bench/gpu_node.py --workloads clm-short --workers 0 --partitions 8,14 --skip-training   # a part

Needs only this repository (``src`` is put on the path) and what such a node has (torch,
transformers, tokenizers, pyarrow, msgpack, aiohttp); ``pyzmq`` is needed for the service runs
(skipped with a message without it), ``fastokens`` only makes ``backend: auto`` faster (without it
feedline falls back, and says so). The real data is read from ``shared/data`` inside the checkout
or beside it (``--data-root``).

1. **Scaling**: ``bench/scaling.py`` on this machine's cores: clm short records, clm documents,
   mlm-128 and pre-tokenized Parquet over ``workers`` and, where the spec has them, over
   ``partitions`` in processes; each as a ratio to the raw ``tokenizers`` encoder on all cores.
2. **Data wait**: ``examples/gpu_check.py`` (BERT-base MLM 128 x 128 rows) and a GPT-2-small
   (124M) clm pack 1024 x 16 rows run, each through the service and in-process. After every
   optimizer step the GPU is synchronised, so the time then spent in ``next(batches)`` is time
   the GPU sat idle; ``data_wait_share`` is its share of the measured steps (target < 0.5 %).
   ``next_ms`` is the mean time inside ``next``.

Everything printed is also saved to ``bench/results/gpu-node[-quick].json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))
# child processes (the scaling runs, gpu_check, spawned partitions) import this checkout's feedline too
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p)
OPTIONAL = ("zmq", "zstandard", "fastokens")
WHEELS = {"zmq": "pyzmq", "zstandard": "zstandard", "fastokens": "fastokens"}


def data_root(given: str | None) -> Path:
    for p in ([Path(given)] if given else []) + [ROOT / "shared" / "data", ROOT.parent / "shared" / "data"]:
        if (p / "prose" / "c4_demo.jsonl").exists():
            return p.resolve()
    sys.exit("gpu_node: no shared/data (prose, tokenizers) inside or beside the checkout; pass --data-root")


def install_wheels(folder: str) -> None:
    missing = [WHEELS[m] for m in OPTIONAL if importlib.util.find_spec(m) is None]
    if missing:
        print(f"installing {', '.join(missing)} from {folder}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links", folder, *missing], check=False)


def environment() -> dict[str, Any]:
    import torch

    have = {m: importlib.util.find_spec(m) is not None for m in OPTIONAL}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cores": cores, "gpu": gpu, "torch": torch.__version__, "optional": have, "load_avg": os.getloadavg()[0]}


# ------------------------------------------------------------------------------- training runs
def _train(loader: Any, step: Any, device: Any, steps: int, warmup: int) -> dict[str, Any]:
    """Steps of ``step(batch)`` with the device synchronised after each; the time in ``next`` is the data wait."""
    import torch

    it = iter(loader)
    wait = tokens = 0.0
    start = time.perf_counter()
    for i in range(1, steps + 1):
        if i == warmup + 1:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start, wait, tokens = time.perf_counter(), 0.0, 0.0
        t0 = time.perf_counter()
        batch = next(it)
        wait += time.perf_counter() - t0
        step(batch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # from here until the next batch arrives, the device is idle
        tokens += float(batch["labels"].ne(-100).sum())
    total = time.perf_counter() - start
    measured = steps - warmup
    return {"steps": measured, "step_ms": round(1000 * total / measured, 2), "next_ms": round(1000 * wait / measured, 4),
            "data_wait_share": round(wait / total, 5), "label_tokens_per_s": round(tokens / total)}


def gpt2_run(spec: dict[str, Any], source: Any, args: argparse.Namespace, placement: str) -> dict[str, Any]:
    """GPT-2 small (or tiny with --quick) on clm pack rows from ``source`` (a spec or a service address)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from feedline.torch import TorchLoader

    device = torch.device(args.device)
    size = {"n_embd": 64, "n_layer": 1, "n_head": 2} if args.quick else {"n_embd": 768, "n_layer": 12, "n_head": 12}
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=50257, n_positions=1024, **size)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def step(batch: dict[str, Any]) -> None:
        with autocast:
            loss = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], labels=batch["labels"],
                         use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    loader = TorchLoader(source, device=device if device.type == "cuda" else None, prefetch=2)
    try:
        out = _train(loader, step, device, args.gpt_steps, args.gpt_warmup)
    finally:
        loader.close()
    b = spec["batching"]["batch_size"]
    name = f"gpt2-{'tiny' if args.quick else 'small'} clm pack {spec['task']['max_length']} x {b}"
    return {"run": name, "placement": placement,
            "parameters": sum(p.numel() for p in model.parameters()), **out}


def gpt2_runs(args: argparse.Namespace, data: Path, have_zmq: bool) -> list[dict[str, Any]]:
    from scaling import unique_corpus

    length, rows = (256, 2) if args.quick else (1024, 16)
    spec = {"sources": [{"path": str(unique_corpus("docs", args.mb)), "format": "jsonl"}],
            "tokenizer": str(data / "tokenizers" / "gpt2" / "tokenizer.json"), "seed": 0, "epochs": None,
            "task": {"kind": "clm", "max_length": length}, "batching": {"strategy": "pack", "batch_size": rows}}
    if args.quick:
        import torch

        torch.set_num_threads(1)
    rows = [gpt2_run(spec, spec, args, "in-process")]
    if have_zmq:
        from feedline.service import serve_process

        with serve_process(spec) as address:
            rows.append(gpt2_run(spec, address, args, "service"))
    return rows


def gpu_check_runs(args: argparse.Namespace, data: Path, have_zmq: bool) -> list[dict[str, Any]]:
    """``examples/gpu_check.py`` in a child process, through the service and in-process."""
    base = [sys.executable, str(ROOT / "examples" / "gpu_check.py"), "--device", args.device,
            "--data", str(data / "prose" / "wiki_demo.txt"), "--tokenizer", str(data / "tokenizers" / "bert-base-uncased")]
    if args.quick:
        base += ["--hidden", "64", "--layers", "1", "--steps", "5", "--warmup", "1", "--batch-size", "4", "--seq-len", "64"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    if args.quick:
        env["OMP_NUM_THREADS"] = "1"  # a tiny model on a shared CPU: one torch thread
    rows = []
    for placement, extra in (("in-process", ["--in-process"]), ("service", [])):
        if placement == "service" and not have_zmq:
            print("gpu_check through the service: skipped (pyzmq is not installed; pass --wheels DIR)")
            continue
        proc = subprocess.run(base + extra, capture_output=True, text=True, env=env, timeout=args.timeout)
        if proc.returncode:
            print(f"gpu_check ({placement}) failed: {proc.stderr.strip().splitlines()[-1:]}")
            continue
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        got["next_ms"] = round(got["data_wait_share"] * got["step_ms"], 4)
        rows.append({"run": f"gpu_check BERT-{'tiny' if args.quick else 'base'} mlm", **got})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CPU-sized: tiny models, few steps, short windows")
    ap.add_argument("--device", help="default: cuda when available, else cpu")
    ap.add_argument("--data-root", help="the shared data directory (default: shared/data inside or beside the checkout)")
    ap.add_argument("--wheels", help="a folder of wheels to install pyzmq/zstandard/fastokens from, if missing")
    ap.add_argument("--workloads", help="the scaling workloads (default: all of bench/scaling.py's)")
    ap.add_argument("--workers", help="the workers curve (default 0,1,4,14; quick 1,14)")
    ap.add_argument("--partitions", help="the K curve, in processes (default 2,8,14 where the spec has partitions; quick 2)")
    ap.add_argument("--seconds", type=float, help="scaling window (default 2.5; quick 1)")
    ap.add_argument("--warmup", type=float, default=0.0,
                    help="seconds after the first batch before the scaling window (default 0: the cold window)")
    ap.add_argument("--mb", type=float, help="corpus size per workload (default 32; quick 8)")
    ap.add_argument("--gpt-steps", type=int, help="default 80 (quick 4)")
    ap.add_argument("--gpt-warmup", type=int, help="default 10 (quick 1)")
    ap.add_argument("--skip-scaling", action="store_true")
    ap.add_argument("--skip-training", action="store_true")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per child process")
    args = ap.parse_args(argv)
    q = args.quick
    args.workers = args.workers or ("1,14" if q else "0,1,4,14")
    args.partitions = args.partitions if args.partitions is not None else ("2" if q else "2,8,14")
    args.seconds = args.seconds or (1.0 if q else 2.5)
    args.mb = args.mb or (8 if q else 32)
    args.gpt_steps, args.gpt_warmup = args.gpt_steps or (4 if q else 80), args.gpt_warmup or (1 if q else 10)
    if args.wheels:
        install_wheels(args.wheels)
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    data = data_root(args.data_root)
    import common  # the corpora and tokenizers read from the data found above

    common.DATA, common.GPT2, common.BERT = data, data / "tokenizers" / "gpt2", data / "tokenizers" / "bert-base-uncased"
    os.environ["FEEDLINE_BENCH_DATA"] = str(data)  # the scaling runs' child processes read it too
    import scaling

    env = environment()
    print(json.dumps(env), flush=True)
    if not env["optional"]["fastokens"]:
        print("fastokens is not installed: backend auto uses the word cache (BERT) or tokenizers (GPT-2)")
    t0, result = time.perf_counter(), {"environment": env, "args": vars(args)}
    if not args.skip_scaling:
        places = "processes" if "parallel" in scaling.spec_fields() and args.partitions else ""
        sargs = argparse.Namespace(workloads=args.workloads or ",".join(scaling.WORKLOADS), workers=args.workers,
                                   partitions=("1," + args.partitions) if places else "", placements=places,
                                   mb=args.mb, seconds=args.seconds, warmup=args.warmup, rounds=1, timeout=args.timeout)
        rows = scaling.run(sargs)
        print(f"scaling on {env['cores']} cores ({args.seconds:g} s windows {args.warmup:g} s after the first batch, one round)")
        scaling.print_rows(rows)
        result["scaling"] = rows
    if not args.skip_training:
        have_zmq = bool(env["optional"]["zmq"])
        if not have_zmq:
            print("pyzmq is not installed: service runs are skipped (pass --wheels DIR)")
        runs = gpu_check_runs(args, data, have_zmq) + gpt2_runs(args, data, have_zmq)
        print(common.table(runs, [("run", "run", ""), ("placement", "placement", ""), ("step_ms", "step ms", ".1f"),
                                  ("data_wait_share", "data wait share", ".4f"), ("next_ms", "ms in next()", ".3f"),
                                  ("tokens_per_s", "tok/s", ",.0f"), ("label_tokens_per_s", "label tok/s", ",.0f")]))
        result["training"] = runs
    result["seconds"] = round(time.perf_counter() - t0, 1)
    print(f"done in {result['seconds']} s; saved {common.save_json('gpu-node' + ('-quick' if q else ''), result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
