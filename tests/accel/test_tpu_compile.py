"""Compiling for real TPU topologies on a CPU host (libtpu's compile-only devices): the
train, eval and decode steps of tiny configs, the kernel chosen for each generation, the
recurrence's precision in the TPU program, FSDP's layout, and the compile tool's exit
codes. Marker `tpu_compile` (its own .ci/run step, after installing jax[tpu]); skipped
where libtpu cannot be imported. The spec-table checks need no libtpu and always run."""

import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType

from t2mlr_jax import sharding
from t2mlr_jax.accel import topologies
from t2mlr_jax.model import kernels

from _util import REPO_ROOT, config_file

ROOT = REPO_ROOT
needs_libtpu = pytest.mark.skipif(not topologies.libtpu_available(),
                                  reason="libtpu is not installed (pip install "
                                         "\"jax[tpu]==<the installed jax>\")")
tpu = [pytest.mark.tpu_compile, needs_libtpu]

# v5e, a v4 megacore slice, v6e, and v2 (no splash there)
TOPOLOGIES = ("v5e:2x2", "v4-8", "v6e:2x2", "v2-8")


_config = config_file


def _t2mlr(**kw):
  return _config("fineweb_135m", "tiny", **{"train.seq_len": 128, "model.max_seq_len": 128,
                                            "model.attention": "auto", **kw})


def _lrt(**kw):
  c = _config("lrt_nanochat", "tiny", **{"train.seq_len": 128, "model.max_seq_len": 128,
                                         "data.max_actions": 8, "model.attention": "auto",
                                         **kw})
  return c


def _report(config, topology, steps=("train",)):
  from t2mlr_jax.accel import aot
  return aot.compile_config(config, topology, steps=steps)


# ------------------------------------------------------------------- kernels


def test_auto_kernel_follows_the_target_devices():
  resolve = kernels.resolve
  assert resolve("auto", "bfloat16", kernels.Target("tpu", "TPU v5 lite")) == "splash"
  assert resolve("auto", "bfloat16", kernels.Target("tpu", "TPU v4")) == "splash"
  assert resolve("auto", "bfloat16", kernels.Target("tpu", "TPU v2")) == "xla"
  assert resolve("auto", "bfloat16", kernels.Target("tpu", "TPU v3")) == "xla"
  assert resolve("auto", "bfloat16", kernels.Target("gpu", "NVIDIA H200")) == "cudnn"
  assert resolve("auto", "float32", kernels.Target("gpu", "NVIDIA H200")) == "xla"
  assert resolve("auto", "bfloat16", kernels.Target("cpu", "cpu")) == "xla"
  with pytest.raises(ValueError, match=r"attention='splash' is invalid: allowed 'xla' or "
                     r"'auto' on TPU v2: the splash kernel needs TPU v4 or later"):
    resolve("splash", "bfloat16", kernels.Target("tpu", "TPU v2"))
  # without a mesh in context: the default backend's devices
  assert kernels.target().platform == jax.default_backend()
  mesh = sharding.make_mesh({"data": 2}, devices=jax.devices()[:2])
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    assert kernels.target() == kernels.Target("cpu", jax.devices()[0].device_kind)


# ------------------------------------------------------------------- FSDP's layout


def _abstract_state(c):
  from t2mlr_jax.train import config as config_lib
  from t2mlr_jax.train.optimizer import make_optimizer
  from t2mlr_jax.train.step import abstract_state
  cfg = config_lib.model_config(c)
  tx, _ = make_optimizer(c.optimizer, 100, cfg)
  return cfg, abstract_state(cfg, tx)


def _mesh(fsdp):
  return AbstractMesh((1, fsdp, 1), sharding.MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def test_fsdp_state_per_device_is_the_total_over_devices_when_the_mesh_divides():
  c = _config("fineweb_135m", "")
  c.model.update(d_model=512, n_heads=8, n_kv_heads=4, d_ff=1536)   # 16 divides every width
  cfg, state = _abstract_state(c)
  shardings = sharding.tree_shardings(state, _mesh(16), cfg)
  rep, total = sharding.replicated_bytes(state, shardings)
  small = sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in jax.tree.leaves(state)
              if a.ndim <= 1 or (a.ndim == 2 and a.shape[0] == cfg.n_layers))
  assert rep == small                         # only norm scales, scalars, step counters
  assert sharding.per_device_bytes(state, shardings) == pytest.approx(
      (total - rep) / 16 + rep, rel=1e-6)


def test_fsdp_shards_lrts_feedback_and_value_embedding_tables():
  """LRT's per-layer W_k / W_v and value-embedding tables (1.1 GiB of d12's 1.2 GiB of
  parameters) have rows in the spec table: on 16 devices only scalars and gates stay whole."""
  c = _config("lrt_nanochat", "d12")
  cfg, state = _abstract_state(c)
  shardings = sharding.tree_shardings(state, _mesh(16), cfg)
  rep, total = sharding.replicated_bytes(state, shardings)
  assert rep / total < 1e-4
  spec = lambda path, shape: tuple(sharding.spec_for(path, shape, _mesh(16), cfg))
  assert spec("layers/memory/ve", (12, 32768, 768)) == (None, None, "fsdp")
  assert spec("layers/memory/w_k", (12, 768, 768)) == (None, "fsdp", None)
  assert spec("recurrence/w_v", (768, 768)) == ("fsdp", None)


def test_fsdp_shards_a_576_wide_model_on_256_devices_along_other_dimensions():
  """576 is no multiple of 256. On the plain fsdp axis the embedding and the MLP split
  along their vocab / hidden dimensions and what has no dimension 256 divides (the
  attention projections, the T2MLR fusion) stays whole; the trainer's mesh factors fsdp
  as 64 x 4 (64 divides 576), and then nothing but norm scales, biases and scalars is
  replicated: the state per chip is the whole over 256."""
  c = _config("fineweb_135m", "")
  cfg, state = _abstract_state(c)
  plain = sharding.tree_shardings(state, _mesh(256), cfg)
  rep, total = sharding.replicated_bytes(state, plain)
  assert rep / total == pytest.approx(0.21, abs=0.02)
  assert tuple(sharding.spec_for("embed/embedding", (49152, 576), _mesh(256), cfg)) == \
      ("fsdp", None)
  assert sharding.fsdp_factors(256, 576) == (64, 4)
  mesh = AbstractMesh((1, 64, 4, 1), ("data", "fsdp", sharding.FSDP_INNER, "tensor"),
                      axis_types=(AxisType.Auto,) * 4)
  shardings = sharding.tree_shardings(state, mesh, cfg)
  for leaf, sh in zip(jax.tree.leaves(state), jax.tree.leaves(shardings)):
    if all(a is None for a in tuple(sh.spec)):
      assert leaf.ndim <= 1 or (leaf.ndim == 2 and leaf.shape[0] == cfg.n_layers), leaf.shape
  rep, total = sharding.replicated_bytes(state, shardings)
  assert rep < 1e-3 * total                   # norm scales, biases, γ, the step counter
  assert sharding.per_device_bytes(state, shardings) == pytest.approx(
      (total - rep) / 256 + rep, rel=1e-6)


# ------------------------------------------------------------------- compiles


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.tpu_compile
@needs_libtpu
def test_t2mlr_steps_compile_with_splash_on_v4_and_later(topology):
  r = _report(_t2mlr(), topology, steps=("train", "eval", "decode"))
  train, evals, decode = r["steps"]
  assert r["fits"] and r["mode"] == "jacobi"
  splash = not topology.startswith("v2")
  assert r["attention"] == ("splash" if splash else "xla")
  assert (train["mosaic_kernels"] > 0) == splash
  assert (evals["mosaic_kernels"] > 0) == splash
  assert decode["mosaic_kernels"] == 0          # decoding keeps its cached attention
  assert train["collectives"].get("all-reduce", 0) > 0     # gradients over the data axis
  assert train["total_bytes"] > 0 and train["model_flops_per_device"] > 0


@pytest.mark.parametrize("topology,windows", [("v5e:2x2", False), ("v5e:2x2", True),
                                              ("v2-8", False)])
@pytest.mark.tpu_compile
@needs_libtpu
def test_lrt_interleaved_train_step_compiles(topology, windows):
  """nanochat's backbone with and without its local windows (splash covers both)."""
  c = _lrt()
  if not windows:
    c.model.window_pattern = None
  r = _report(c, topology)
  assert r["fits"] and r["mode"] == "interleaved"
  assert (r["steps"][0]["mosaic_kernels"] > 0) == (not topology.startswith("v2"))


@pytest.mark.tpu_compile
@needs_libtpu
def test_an_rl_configs_grpo_update_and_sampler_compile_for_tpu():
  """An RL config's train step is GRPO's update on its largest rollout, beside it the
  sampler; the reference model is counted as held beside both (rl.beta > 0)."""
  c = _config("rl_variable_assignment", "tiny", **{"mesh.data": 1, "mesh.fsdp": -1})
  r = _report(c, "v5e:2x2")
  assert r["fits"] and [s["step"] for s in r["steps"]] == ["train", "sample"]
  train, sample = r["steps"]
  assert train["rows"] == 8 * 2 and train["completion_tokens"] == 3
  assert train["resident_bytes"] > 0 and sample["resident_bytes"] > train["resident_bytes"]
  assert train["collectives"].get("all-gather", 0) > 0       # FSDP's parameter gathers


@pytest.mark.tpu_compile
@needs_libtpu
def test_bf16_tpu_program_keeps_the_recurrence_in_fp32_at_highest_precision():
  """Lowered under the default matmul precision (conftest forces 'highest' otherwise): the
  recurrence's fusion matmuls (W_rec, the gates: d_model-wide fp32 dots) stay at
  operand_precision={highest,highest} in the TPU-compiled module, the backbone's at bf16."""
  from t2mlr_jax.accel import aot
  c = _t2mlr(**{"model.dtype": "bfloat16"})
  with jax.default_matmul_precision("default"):
    r = aot.compile_config(c, "v5e:2x2", steps=("train",), keep_text=True)
  text = r["steps"][0]["hlo_text"]
  dots = [ln for ln in text.splitlines() if re.search(r"\bdot\(|convolution\(", ln)]
  highest = [ln for ln in dots if "operand_precision={highest,highest}" in ln]
  assert highest, "no highest-precision dot in the TPU program"
  assert all(re.search(r"= f32\[", ln) and "bf16[" not in ln.split("dot(")[-1]
             for ln in highest)
  assert any("bf16[" in ln for ln in dots)     # the backbone's matmuls in bf16


@pytest.mark.tpu_compile
@needs_libtpu
def test_compile_tool_exit_codes(tmp_path):
  def run(*args, env=None):
    # (this process holds libtpu too)
    env = env or {**os.environ, "JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    return subprocess.run([sys.executable, "-m", "t2mlr_jax.compile", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
  tiny = f"--config={ROOT}/configs/fineweb_135m.py:tiny"
  out = tmp_path / "fit.json"
  # JAX_PLATFORMS unset, as a user has it: libtpu installed, no TPU chips, no libtpu noise
  unset = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  p = run(tiny, "--topology=v5e-4", f"--output={out}",
          env={**unset, "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"})
  assert p.returncode == 0, p.stderr[-2000:]
  assert "TPU_WORKER_HOSTNAMES" not in p.stderr and "libtpu" not in p.stderr, p.stderr
  assert p.stdout.strip().endswith("fits") and json.loads(out.read_text())["fits"]
  # a small plain model at a huge batch fails fast: the compiler's numbers, exit 3
  p = run(tiny, "--topology=v5e-4", "--config.model.recurrence.type=none",
          "--config.model.vocab_size=65536", "--config.train.batch_size=4096",
          "--config.train.seq_len=64", "--config.model.max_seq_len=64")
  assert p.returncode == 3, p.stderr[-2000:]
  assert re.search(r"DOES NOT FIT: the compiler needs [\d.]+\w? of [\d.]+\w? hbm", p.stdout)
  p = run(tiny, "--topology=v5e-12")
  assert p.returncode == 2 and "--topology='v5e-12' is unknown" in p.stderr
  assert len(p.stderr.strip().splitlines()) == 1
  p = run(tiny, "--topology=v2-8", "--config.model.attention=splash",
          "--config.train.seq_len=128", "--config.model.max_seq_len=128")
  assert p.returncode == 2
  assert "attention='splash' is invalid: allowed 'xla' or 'auto' on TPU v2" in p.stderr


@pytest.mark.tpu_compile
@needs_libtpu
def test_quickstart_notebooks_tpu_path_compiles_for_colabs_v2_8():
  """The quickstart's config cell as it runs on a TPU runtime of 8 devices (Colab's free
  v2-8): its train step compiles there, `auto` resolving to xla."""
  import types
  nb = json.load(open(os.path.join(ROOT, "notebooks", "quickstart.ipynb")))
  cell = next("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"
              and "get_config(" in "".join(c["source"]))
  import importlib.util
  namespace = {"importlib": importlib, "os": os, "REPO": ROOT, "SIZE": "default",
               "jax": types.SimpleNamespace(device_count=lambda: 8)}
  exec(compile(cell, "quickstart-config-cell", "exec"), namespace)
  r = _report(namespace["config"], "v2-8", steps=("train", "eval"))
  assert r["fits"] and r["attention"] == "xla" and r["devices"] == 8
  assert all(s["mosaic_kernels"] == 0 for s in r["steps"])


@pytest.mark.tpu_compile
@needs_libtpu
def test_a_user_modules_type_and_schedule_compile_for_tpu(tmp_path):
  """docs/examples' recurrence type under its own schedule: the compile tool takes
  --user_module as the trainer does, and its train step compiles for a v5e slice."""
  examples = os.path.join(ROOT, "docs", "examples")
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
  out = tmp_path / "fit.json"
  p = subprocess.run([sys.executable, "-m", "t2mlr_jax.compile",
                      f"--user_module={examples}/echo.py,{examples}/full_jacobi.py",
                      f"--config={examples}/s5_echo.py:tiny", "--topology=v5e:2x2",
                      "--config.train.mode=full_jacobi", f"--output={out}"],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stderr[-2000:]
  report = json.loads(out.read_text())
  train = next(s for s in report["steps"] if s["step"] == "train")
  assert report["fits"] and train["mode"] == report["mode"] == "full_jacobi", report
  assert train["model_flops_per_device"] > 0     # the schedule's own FLOPs declaration


@pytest.mark.tpu_compile
@needs_libtpu
@pytest.mark.parametrize("example", ["two_step", "low_rank_mixer"])
def test_a_two_vector_state_and_a_users_mixer_compile_for_tpu(tmp_path, example):
  """docs/examples' two-vector-state type and its own mixer: the train, eval and decode
  steps compile for a v5e slice (the state's leaves laid out over the batch axes)."""
  examples = os.path.join(ROOT, "docs", "examples")
  config = {"two_step": (f"--config={examples}/s5_two_step.py:tiny",),
            "low_rank_mixer": ("--config=configs/s5_retrieval.py:tiny",
                               "--config.model.recurrence.mixer=low_rank")}[example]
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
  out = tmp_path / "fit.json"
  p = subprocess.run([sys.executable, "-m", "t2mlr_jax.compile",
                      f"--user_module={examples}/{example}.py", *config, "--topology=v5e:2x2",
                      "--steps=train,eval,decode",
                      f"--output={out}"],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stderr[-2000:]
  report = json.loads(out.read_text())
  assert report["fits"], report
  assert {s["step"] for s in report["steps"]} == {"train", "eval", "decode"}, report


@pytest.mark.tpu_compile
@needs_libtpu
def test_the_clis_skip_the_tpu_backend_on_a_host_without_tpus():
  """With jax[tpu] installed and JAX_PLATFORMS unset, JAX would try libtpu's backend first
  and print its initialisation errors; the command-line tools leave it out."""
  code = ("from t2mlr_jax import cli\nprint(cli.skip_absent_tpu())\n"
          "import jax\nprint(jax.default_backend())")
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  p = subprocess.run([sys.executable, "-c", code], env={**env, "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"},
                     capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr[-2000:]
  assert p.stdout.split() == ["cpu", "cpu"] and "TPU_WORKER_HOSTNAMES" not in p.stderr
  given = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**env, "JAX_PLATFORMS": "cpu"}, timeout=300)
  assert given.stdout.split() == ["None", "cpu"]          # a user's choice stands

