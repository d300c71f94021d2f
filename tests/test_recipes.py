"""The recipes in docs/recipes.md run as written: each script is copied out of the page and run.

A recipe is the code block after a ``<!-- recipe: NAME -->`` line. The scripts run from a
directory holding only the page's ``spec.yaml`` (made by its ``make_spec.py``) and the demo
assets, as a reader would run them: the Python ones as ``__main__`` in this process (``runpy``:
the text as written, without an interpreter start and a torch/transformers import of 3-7 CPU-s
each), the shell one (``feedline serve`` and torchrun) in its own processes. A recipe whose
trainer is not installed is skipped with the reason. Ray Train's recipe is not run here (see the page).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import runpy
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "recipes.md"
RECIPE = re.compile(r"<!-- recipe: (?P<name>[\w.]+) -->\n```\w*\n(?P<code>.*?)\n```", re.S)

pytestmark = pytest.mark.slow


def recipes() -> dict[str, str]:
    return {m["name"]: m["code"] + "\n" for m in RECIPE.finditer(PAGE.read_text(encoding="utf-8"))}


def needs(*modules: str) -> None:
    for m in modules:
        if importlib.util.find_spec(m) is None:
            pytest.skip(f"recipe needs {m}, which is not installed")


def run(cwd: Path, *cmd: str, timeout: float = 240) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture
def run_here(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """``python SCRIPT ARGS`` from a directory, in this process; returns what it printed."""
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)

    def run_script(cwd: Path, script: str, *args: str) -> str:
        monkeypatch.chdir(cwd)
        monkeypatch.setattr(sys, "argv", [script, *args])
        capsys.readouterr()
        runpy.run_path(str(cwd / script), run_name="__main__")
        return capsys.readouterr().out

    return run_script


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The page's make_spec.py, run once (as ``__main__`` in this process): spec.yaml and the demo assets."""
    d = tmp_path_factory.mktemp("recipes")
    (d / "make_spec.py").write_text(recipes()["make_spec.py"])
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(d)
        mp.setattr(sys, "argv", ["make_spec.py"])
        runpy.run_path(str(d / "make_spec.py"), run_name="__main__")
    assert (d / "spec.yaml").is_file()
    return d


@pytest.fixture
def workdir(made: Path, tmp_path: Path) -> Path:
    """A directory holding spec.yaml, the assets and every recipe script."""
    shutil.copy(made / "spec.yaml", tmp_path / "spec.yaml")
    (tmp_path / "assets").symlink_to(made / "assets")
    for name, code in recipes().items():
        (tmp_path / name).write_text(code)
    return tmp_path


def state_step(path: Path) -> int:
    return int(json.loads(path.read_text())["step"])


def test_the_page_holds_every_recipe() -> None:
    assert set(recipes()) == {"make_spec.py", "train_torch.py", "serve_torchrun.sh", "train_hf.py",
                              "train_accelerate.py", "train_lightning.py", "train_jax.py", "train_ray.py"}


def test_torch_recipe_trains_and_resumes(workdir: Path, run_here) -> None:  # type: ignore[no-untyped-def]
    needs("torch")
    import torch

    out = run_here(workdir, "train_torch.py")
    assert "rank 0 step 20 " in out, out
    assert torch.load(workdir / "ckpt.pt")["data"]["step"] == 20
    out = run_here(workdir, "train_torch.py")   # the page: the second run resumes at 21
    assert "rank 0 step 25 " in out and "rank 0 step 40 " in out and "step 20 " not in out, out
    assert torch.load(workdir / "ckpt.pt")["data"]["step"] == 40


def test_torchrun_with_the_service(workdir: Path) -> None:
    needs("torch", "zmq")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = (workdir / "serve_torchrun.sh").read_text().replace("5555", str(port))
    script = "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + script  # no server left behind if a rank fails
    out = run(workdir, "bash", "-e", "-c", script)
    assert "rank 0 step 20 " in out and "rank 1 step 20 " in out, out


def test_hf_trainer_recipe_saves_the_data_state_of_each_checkpoint(workdir: Path, run_here) -> None:  # type: ignore[no-untyped-def]
    needs("torch", "transformers", "accelerate")
    out = run_here(workdir, "train_hf.py")
    assert "data state after 20 steps" in out, out
    # the pass-through DataLoader reads no batch ahead: each checkpoint's state is its step's
    assert state_step(workdir / "out" / "checkpoint-10" / "feedline_state.json") == 10
    assert state_step(workdir / "out" / "checkpoint-20" / "feedline_state.json") == 20


def test_accelerate_recipe(workdir: Path, run_here) -> None:  # type: ignore[no-untyped-def]
    needs("torch", "accelerate")
    out = run_here(workdir, "train_accelerate.py")
    assert out.startswith("step 20 loss "), out
    assert state_step(workdir / "acc_ckpt" / "feedline_state.json") == 20
    assert (workdir / "acc_ckpt" / "model.safetensors").exists()


def test_lightning_recipe_resumes_model_and_data(workdir: Path, run_here) -> None:  # type: ignore[no-untyped-def]
    needs("torch", "lightning")
    import torch

    run_here(workdir, "train_lightning.py")
    first = torch.load(workdir / "ckpt" / "last.ckpt", weights_only=False)
    assert (first["global_step"], first["feedline"]["step"]) == (20, 20)  # not 21: the batch read ahead
    run_here(workdir, "train_lightning.py", "30")
    last = torch.load(workdir / "ckpt" / "last.ckpt", weights_only=False)
    assert (last["global_step"], last["feedline"]["step"]) == (30, 30)


@pytest.mark.xdist_group("jax")  # on the worker that imports jax for every JAX test (test_jax_loader.py)
def test_jax_recipe(workdir: Path, run_here) -> None:  # type: ignore[no-untyped-def]
    needs("jax", "optax")
    out = run_here(workdir, "train_jax.py")
    assert out.startswith("step 20 loss "), out


def test_readme_quick_start_runs_and_resumes(tmp_path: Path, run_here) -> None:  # type: ignore[no-untyped-def]
    readme = (PAGE.parents[1] / "README.md").read_text(encoding="utf-8")
    quick = readme.split("## Quick start", 1)[1]
    code = re.search(r"```python\n(.*?)\n```", quick, re.S)
    assert code, "README.md: no python block under '## Quick start'"
    check = ("\nfrom feedline.testing import assert_batches_equal\n"
             "again = [b for _, b in zip(range(4), feedline.Loader(spec))]\n"
             "assert_batches_equal(first, again[:3])\n"
             "assert_batches_equal([next(iter(resumed))], again[3:])\n"
             "print('resumed exactly')\n")
    (tmp_path / "quick.py").write_text(code[1] + check)
    out = run_here(tmp_path, "quick.py")
    assert out.splitlines() == ["(8, 128) 3", "resumed exactly"], out
