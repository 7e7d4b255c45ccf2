"""Compiling for NVIDIA GPU nodes on a CPU host (the CUDA plugin's compile-only devices,
JAX_PLATFORMS=cpu): the train, eval and decode steps of tiny configs for an H100 node,
an A100 node and a T4, the cuDNN kernel chosen for each card (and the form it is given),
the recurrence's precision in the GPU program, a sharded step over two nodes, and the
compile tool's exit codes. Marker `gpu_compile` (its own .ci/run step, in a venv with
jax[cuda12]); skipped where the plugin is not installed. The missing-plugin error needs no
plugin and always runs (the GPU names' table: tests/accel/test_topologies.py)."""

import json
import os
import re
import subprocess
import sys

import jax
import pytest

from t2mlr_jax.accel import aot, topologies
from t2mlr_jax.model import kernels

from _util import REPO_ROOT, config_file

ROOT = REPO_ROOT
needs_cuda_plugin = pytest.mark.skipif(not topologies.cuda_plugin_available(),
                                       reason="JAX's CUDA plugin is not installed (pip "
                                              "install \"jax[cuda12]==<the installed jax>\")")
FUSED = r'custom_call_target="__cudnn\$fmha'
CAUSAL_FORM = 'custom_call_target="__cudnn$fmhaSoftmax"'      # no bias: no mask in memory
MASK_FORM = 'custom_call_target="__cudnn$fmhaScaleBiasSoftmax"'


_config = config_file


def _t2mlr(**kw):
  """fineweb_135m's tiny T2MLR (packed documents: cuDNN takes the mask) in bf16."""
  return _config("fineweb_135m", "tiny", **{"train.seq_len": 128, "model.max_seq_len": 128,
                                            "model.attention": "auto",
                                            "model.dtype": "bfloat16", **kw})


def _lrt(**kw):
  """nanochat's backbone with LRT (no segment ids: cuDNN's causal form), windows mixed
  within a layer scan (S, L)."""
  return _config("lrt_nanochat", "tiny", **{"train.seq_len": 128, "model.max_seq_len": 128,
                                            "data.max_actions": 8, "model.attention": "auto",
                                            "model.window_pattern": "SL",
                                            "model.window_short": 32, **kw})


def _run_tool(*args, env=None):
  env = env or {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, "-m", "t2mlr_jax.compile", *args], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=600)


# ------------------------------------------------------------------- no plugin


def test_missing_plugin_is_one_line_naming_the_pinned_install():
  """Without the CUDA plugin the tool exits 2 with one line: what to install, pinned to
  the installed jax."""
  code = ("import runpy, sys\nfrom t2mlr_jax.accel import topologies\n"
          "topologies.cuda_plugin_available = lambda: False\n"
          f"sys.argv = ['compile', '--config={ROOT}/configs/fineweb_135m.py:tiny', "
          "'--topology=h100-8']\nrunpy.run_module('t2mlr_jax.compile', run_name='__main__')")
  p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                     text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert p.returncode == 2, p.stderr[-2000:]
  lines = [ln for ln in p.stderr.strip().splitlines() if ln.startswith("error:")]
  assert len(lines) == 1 and f'pip install "jax[cuda12]=={jax.__version__}"' in lines[0]


# ------------------------------------------------------------------- compiles


@pytest.mark.gpu_compile
@needs_cuda_plugin
def test_h100_node_compiles_t2mlr_steps_with_the_fused_kernel():
  """T2MLR Jacobi on an H100 node: the train and exact eval steps carry cuDNN's fused
  attention (packed documents: the mask form), decoding keeps its cached attention; the
  data-parallel gradients meet in an all-reduce."""
  devices = topologies.devices(topologies.resolve("h100-8"))
  assert kernels.target_of(devices) == kernels.Target("gpu", "NVIDIA H100 80GB HBM3", (9, 0))
  r = aot.compile_config(_t2mlr(), "h100-8", steps=("train", "eval", "decode"),
                         keep_text=True)
  train, evals, decode = r["steps"]
  assert r["fits"] and r["mode"] == "jacobi" and r["attention"] == "cudnn"
  assert r["device_kind"] == "NVIDIA H100 80GB HBM3" and r["platform"] == "gpu"
  assert train["kernels"]["fused_attention"] > 0 and evals["kernels"]["fused_attention"] > 0
  assert MASK_FORM in train["hlo_text"] and "fmhaScaleBiasSoftmaxBackward" in train["hlo_text"]
  assert decode["kernels"]["fused_attention"] == 0
  assert train["kernels"]["gemm"] > 0
  assert train["collectives"].get("all-reduce", 0) > 0
  assert train["model_flops_per_device"] > 0 and train["step_seconds_floor"] > 0


@pytest.mark.gpu_compile
@needs_cuda_plugin
def test_a100_node_compiles_lrt_with_cudnns_causal_form_and_local_windows():
  """LRT interleaved on nanochat's backbone on an A100 node: no segment ids, so cuDNN runs
  causal with sequence lengths and its sliding window (no mask), one call per window."""
  c = _lrt(**{"model.dtype": "bfloat16"})
  r = aot.compile_config(c, "a100-8", steps=("train", "eval"), keep_text=True)
  train, evals = r["steps"]
  assert r["fits"] and r["mode"] == "interleaved" and r["attention"] == "cudnn"
  assert train["kernels"]["fused_attention"] > 0 and evals["kernels"]["fused_attention"] > 0
  assert CAUSAL_FORM in train["hlo_text"] and MASK_FORM not in train["hlo_text"]
  assert re.search(r'"sliding_window_length": ?33', train["hlo_text"]), \
      "the short window (32 back) as cuDNN's sliding window"


@pytest.mark.gpu_compile
@needs_cuda_plugin
def test_t4_compiles_without_the_fused_kernel_and_refuses_it_forced():
  """Colab's free T4 (compute capability 7.5): `auto` is xla, the steps compile without a
  cuDNN call; `cudnn` forced is one line naming model.attention."""
  r = aot.compile_config(_t2mlr(), "t4-1", steps=("train", "eval"), keep_text=True)
  assert r["fits"] and r["attention"] == "xla" and r["device_kind"] == "Tesla T4"
  for step in r["steps"]:
    assert step["kernels"]["fused_attention"] == 0
    assert not re.search(FUSED, step["hlo_text"])
  with pytest.raises(ValueError, match=r"^config field model\.attention='cudnn' is invalid: "
                     r"allowed 'xla' or 'auto' on Tesla T4: cudnn needs a GPU of compute "
                     r"capability 8\.0 or later \(Tesla T4 is 7\.5\)$"):
    aot.compile_config(_t2mlr(**{"model.attention": "cudnn"}), "t4-1")


@pytest.mark.gpu_compile
@needs_cuda_plugin
def test_bf16_gpu_program_keeps_the_recurrence_in_fp32_without_tf32():
  """Lowered under the default matmul precision (conftest forces 'highest' otherwise; on
  a GPU 'default' lets fp32 dots run in TF32): the recurrence's fusion matmuls stay fp32
  dots at operand_precision={highest,highest} (no TF32) with fp32 operands in the
  GPU-compiled module, the backbone's in bf16."""
  with jax.default_matmul_precision("default"):
    r = aot.compile_config(_t2mlr(), "h100-8", steps=("train",), keep_text=True)
  text = r["steps"][0]["hlo_text"]
  types = dict(re.findall(r"%([\w.\-]+) = (\w+)\[", text))       # instruction -> dtype
  dots = [ln for ln in text.splitlines() if re.search(r"\bdot\(", ln)]
  highest = [ln for ln in dots if "operand_precision={highest,highest}" in ln]
  assert highest, "no highest-precision dot in the GPU program"
  for ln in highest:
    assert re.search(r"= f32\[", ln), ln
    operands = re.search(r"\bdot\(%([\w.\-]+), %([\w.\-]+)\)", ln).groups()
    assert all(types[o] == "f32" for o in operands), ln
    assert "tf32" not in ln.lower(), ln
  assert any(re.search(r"= bf16\[", ln) for ln in dots)      # the backbone's matmuls


@pytest.mark.gpu_compile
@needs_cuda_plugin
def test_two_h100_nodes_shard_the_state_and_reduce_gradients():
  """fineweb_135m's FSDP mesh over two nodes of 8: the state is sharded over 16 devices
  (parameters gathered, gradients reduce-scattered) and the step compiles."""
  c = _t2mlr(**{"train.batch_size": 16})
  c.mesh.update(data=1, fsdp=-1, tensor=1)
  r = aot.compile_config(c, "h100-2x8")
  train = r["steps"][0]
  assert r["fits"] and r["devices"] == 16 and r["mesh"]["fsdp"] == 16
  assert train["collectives"].get("all-gather", 0) > 0
  assert (train["collectives"].get("reduce-scatter", 0)
          + train["collectives"].get("all-reduce", 0)) > 0
  assert train["kernels"]["fused_attention"] > 0
  with pytest.raises(ValueError, match=r"--num_slices=2 is invalid for GPU nodes: allowed 1 "
                     r"\(several nodes are named: h100-2x8\)"):
    aot.compile_config(c, "h100-8", num_slices=2)


@pytest.mark.gpu_compile
@needs_cuda_plugin
def test_compile_tool_exit_codes_for_gpus(tmp_path):
  tiny = f"--config={ROOT}/configs/fineweb_135m.py:tiny"
  out = tmp_path / "fit.json"
  # JAX_PLATFORMS unset, as a user has it: the tool keeps the host on its CPU
  unset = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  p = _run_tool(tiny, "--topology=h100-8", "--config.model.dtype=bfloat16",
                "--config.model.attention=auto", f"--output={out}", env=unset)
  assert p.returncode == 0, p.stderr[-2000:]
  report = json.loads(out.read_text())
  assert p.stdout.strip().endswith("fits") and report["fits"]
  assert "cuDNN fused attention" in p.stdout and "0.75 of 79.65 GiB" in p.stdout
  # a program above what a JAX process gets on the card: exit 3, the numbers
  p = _run_tool(tiny, "--topology=t4-1", "--config.model.recurrence.type=none",
                "--config.model.vocab_size=65536", "--config.train.batch_size=512",
                "--config.train.seq_len=64", "--config.model.max_seq_len=64")
  assert p.returncode == 3, p.stderr[-2000:]
  assert re.search(r"train: DOES NOT FIT: [\d.]+ GiB of 10\.25 GiB per device", p.stdout)
  p = _run_tool(tiny, "--topology=h100-3")
  assert p.returncode == 2 and "--topology='h100-3' is unknown" in p.stderr
  assert len(p.stderr.strip().splitlines()) == 1
  p = _run_tool(tiny, "--topology=t4-1", "--config.model.dtype=bfloat16",
                "--config.model.attention=cudnn")
  assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr[-2000:]
  assert "model.attention='cudnn' is invalid: allowed 'xla' or 'auto' on Tesla T4" in p.stderr


@pytest.mark.gpu_compile
@needs_cuda_plugin
def test_bench_accel_compiles_its_own_functions_for_one_h200(tmp_path):
  """The device benchmark compiled before a lent H200 runs it: its baseline and Jacobi
  16/4 train steps at 135M in bf16, its fused-attention check (cuDNN), generate's decode
  loop and time-to-first-token call, each within what a process gets on the card."""
  out = tmp_path / "bench.json"
  p = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "bench_accel.py"),
                      "--compile_only=h200-1", "--shapes=smollm2-135m", f"--out={out}"],
                     cwd=ROOT, capture_output=True, text=True, timeout=600,
                     env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert p.returncode == 0, p.stderr[-2000:]
  report = json.loads(out.read_text())
  rows = report["shapes"]["smollm2-135m"]
  assert report["device"] == "NVIDIA H200" and report["fits"]
  assert set(rows) == {"baseline_train", "t2mlr_train", "attention_cudnn", "decode_b64",
                       "ttft_1024"}
  assert rows["attention_cudnn"]["fused_attention"] > 0
  assert all(r["total_bytes"] > 0 and r["gemm"] > 0 for r in rows.values())


# the largest model (Pathfinding on Qwen2.5-0.5B) and the longest sequences (HotpotQA, 8192):
# the SmolLM2 recipes of Pathfinding (4096) and ProsQA (2048) run the same model on as many
# tokens a micro-batch (32768), in shorter sequences
RELEASE_RECIPES = [("pathfinding", "release_qwen", "qwen2.5-0.5b"),
                   ("hotpotqa", "release_smollm2", "smollm2-135m")]


@pytest.mark.parametrize("name,variant,shape", RELEASE_RECIPES,
                         ids=[f"{n}:{v}" for n, v, _ in RELEASE_RECIPES])
@pytest.mark.gpu_compile
@needs_cuda_plugin
def test_the_release_recipes_fit_one_h100(name, variant, shape):
  """The reasoning tasks' release recipes at their full lengths and batches (accumulated
  micro-batches), on the model shape their docstring names, fit the one H100 they name
  (54.5 of 58.7 GiB for Qwen2.5-0.5B)."""
  config = _config(name, variant, **{"model.init_from": shape})
  r = aot.compile_config(config, "h100-1")
  (train,) = r["steps"]
  assert r["fits"], train
  assert r["mode"] == "jacobi" and r["attention"] == "cudnn"
  assert train["kernels"]["fused_attention"] > 0
