"""Attention kernels (model/kernels.py): splash equals xla on CPU in Pallas interpret mode,
values and gradients, with packed segments and padding; cuDNN's arguments (causal with
lengths, windows, the mask) run through JAX's reference and equal xla; the kernel choice
is validated for each card."""

import jax
import numpy as np
import pytest

from t2mlr_jax import ModelConfig, T2MLRConfig, init_params
from t2mlr_jax.model import kernels
from t2mlr_jax.model.api import loss
from t2mlr_jax.model.modes import forward

T = 128


def _batch():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 64, (2, T)).astype(np.int32)
  cf = np.full((2, T), 2, np.int32)
  cf[1, -20:] = 0                                 # right padding
  seg = np.zeros((2, T), np.int32)
  seg[0, 50:] = 1                                 # two packed documents in row 0
  targets = np.where(cf > 0, rng.integers(0, 64, (2, T)), -100).astype(np.int32)
  return tokens, cf, seg, targets


@pytest.mark.parametrize("mode", ["parallel", pytest.param("jacobi", marks=pytest.mark.slow)])
def test_splash_equals_xla_in_values_and_gradients(mode):
  base = dict(vocab_size=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=64,
              max_seq_len=T, recurrence=T2MLRConfig(l_start=1, l_end=1),
              schedule_options=dict(d_forward=2, d_backward=1))
  xla, splash = ModelConfig(**base), ModelConfig(**base, attention="splash")
  params = init_params(xla, jax.random.PRNGKey(0))
  tokens, cf, seg, targets = _batch()
  side = dict(control_flow=cf, segment_ids=seg)
  a = forward(params, xla, tokens, mode=mode, **side)
  b = forward(params, splash, tokens, mode=mode, **side)
  valid = cf > 0
  np.testing.assert_allclose(np.asarray(b)[valid], np.asarray(a)[valid], atol=2e-5)
  grad = lambda cfg: jax.grad(lambda p: loss(p, cfg, tokens, mode=mode, targets=targets,
                                             **side))(params)
  for x, y in zip(jax.tree.leaves(grad(splash)), jax.tree.leaves(grad(xla))):
    np.testing.assert_allclose(x, y, atol=2e-5)


def test_splash_falls_back_to_xla_below_its_block_and_auto_resolves_by_backend():
  cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                    max_seq_len=64, attention="splash")
  params = init_params(cfg, jax.random.PRNGKey(0))
  tokens = np.arange(40, dtype=np.int32)[None] % 64      # T = 40: not a multiple of 128
  np.testing.assert_array_equal(forward(params, cfg, tokens, mode="parallel"),
                                forward(params, cfg.replace(attention="xla"), tokens,
                                        mode="parallel"))
  target = kernels.Target
  assert kernels.resolve("auto", "float32", target("cpu")) == "xla"
  assert kernels.resolve("auto", "bfloat16", target("gpu")) == "cudnn"
  assert kernels.resolve("auto", "float32", target("gpu")) == "xla"
  assert kernels.resolve("auto", "float32", target("tpu", "TPU v5 lite")) == "splash"
  assert kernels.resolve("auto", "float32", target("tpu", "TPU v3")) == "xla"


@pytest.mark.parametrize("recurrent", [pytest.param(False, marks=pytest.mark.slow), True],
                         ids=["mixed-window-scan", "t2mlr"])     # the first: slow step
def test_splash_covers_local_windows(recurrent):
  """nanochat's windowed layers run the kernel's band mask: a scan over layers of mixed
  windows switches between one kernel per window (plain model), a segment of one window
  passes it statically (T2MLR's one-layer segments); both equal xla."""
  base = dict(vocab_size=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=64,
              max_seq_len=T, window_pattern="SL", window_short=32,
              recurrence=T2MLRConfig(l_start=1, l_end=1) if recurrent else None,
              schedule_options=dict(d_forward=2, d_backward=1))
  xla, splash = ModelConfig(**base), ModelConfig(**base, attention="splash")
  assert xla.layer_windows == (32, 128, 128)
  params = init_params(xla, jax.random.PRNGKey(0))
  tokens, cf, seg, targets = _batch()
  side = dict(control_flow=cf, segment_ids=seg)
  mode = "jacobi" if recurrent else "parallel"
  a = forward(params, xla, tokens, mode=mode, **side)
  b = forward(params, splash, tokens, mode=mode, **side)
  valid = cf > 0
  np.testing.assert_allclose(np.asarray(b)[valid], np.asarray(a)[valid], atol=2e-5)
  if not recurrent:
    text = jax.jit(lambda p: forward(p, splash, tokens, mode=mode, **side)).lower(
        params).as_text()
    assert "case" in text or "conditional" in text      # the per-window switch
    grad = lambda cfg: jax.grad(lambda p: loss(p, cfg, tokens, mode=mode, targets=targets,
                                               **side))(params)
    for x, y in zip(jax.tree.leaves(grad(splash)), jax.tree.leaves(grad(xla))):
      np.testing.assert_allclose(x, y, atol=2e-5)


def test_attention_field_is_validated():
  with pytest.raises(ValueError, match=r"attention='flash' is invalid: allowed one of"):
    ModelConfig(attention="flash")
  with pytest.raises(ValueError, match="attention='cudnn' is invalid: .*cudnn needs a GPU"):
    kernels.check_available("cudnn", "float32")
  with pytest.raises(ValueError, match="attention='splash' is invalid: .*splash is a TPU "
                     "kernel"):
    kernels.resolve("splash", "bfloat16", kernels.Target("gpu", "NVIDIA H200"))


@pytest.mark.slow
def test_splash_under_the_train_steps_mesh_runs_per_shard_and_equals_xla():
  """On a 2x2x2 mesh the kernel runs inside shard_map (batch over data×fsdp, heads over
  tensor); the sharded train step's loss equals the xla one."""
  from t2mlr_jax import sharding
  from t2mlr_jax.train.config import base_config
  from t2mlr_jax.train.optimizer import make_optimizer
  from t2mlr_jax.train.step import create_state, make_train_step
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  tokens, cf, seg, targets = _batch()
  tokens, cf, seg, targets = (np.tile(a, (2, 1)) for a in (tokens, cf, seg, targets))
  batch = {"input_ids": tokens, "target_ids": targets, "control_flow": cf, "segment_ids": seg}
  batch = {k: jax.device_put(v, sharding.batch_sharding(mesh)) for k, v in batch.items()}
  tx, schedule = make_optimizer(base_config().optimizer, 10)
  losses = {}
  for impl in ("xla", "splash"):
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                      d_ff=64, max_seq_len=T, attention=impl)
    state = create_state(cfg, tx, jax.random.PRNGKey(0), mesh)
    step = make_train_step(cfg, tx, schedule, "parallel", mesh)
    if impl == "splash":     # the kernel sits in a manual (per-shard) computation
      text = step.lower(state, batch).as_text()
      assert "sdy.manual_computation" in text and '{"data", "fsdp"}, {}, {"tensor"}' in text
    _, metrics = step(state, batch)
    losses[impl] = float(metrics["loss"])
  assert losses["splash"] == pytest.approx(losses["xla"], abs=1e-5)


# ------------------------------------------------------------------- cuDNN, without a GPU
# The cuDNN path's arguments run through JAX's own reference (`implementation="xla"` of
# jax.nn.dot_product_attention takes the same is_causal, lengths, window and mask) on the
# CPU; the GPU compiles (tests/accel/test_gpu_compile.py) check that the fused call is emitted.
H100 = kernels.Target("gpu", "NVIDIA H100 80GB HBM3", (9, 0))


@pytest.fixture
def cudnn_on_cpu(monkeypatch):
  """`attention="cudnn"` runs here: the target is an H100, the card check passes any
  dtype, and the cuDNN call runs JAX's reference with the arguments cuDNN would get.
  Yields the forms called: "mask", or "lengths" with the window (None: full)."""
  forms = []
  orig = jax.nn.dot_product_attention

  def spy(q, k, v, bias=None, mask=None, *, implementation=None, **kw):
    assert implementation == "cudnn" and kw["is_causal"] and bias is None
    forms.append("mask" if mask is not None else
                 ("lengths", kw["key_value_seq_lengths"] is not None, kw["local_window_size"]))
    return orig(q, k, v, bias, mask, implementation="xla", **kw)

  monkeypatch.setattr(kernels, "target", lambda: H100)
  monkeypatch.setattr(kernels, "cudnn_unsupported", lambda *a, **k: None)
  monkeypatch.setattr(jax.nn, "dot_product_attention", spy)
  yield forms


def test_cudnn_takes_lengths_without_segment_ids_and_the_mask_with_them():
  cf = np.array([[2, 2, 2, 0, 0], [2, 2, 2, 2, 2], [0, 0, 0, 0, 0]], np.int32)
  plain = kernels.kernel_inputs(cf, None)
  np.testing.assert_array_equal(plain.lengths_B, [3, 5, 1])   # a padded row keeps one
  np.testing.assert_array_equal(plain.segments_BT[0], [0, 0, 0, -1, -1])
  packed = kernels.kernel_inputs(cf, np.array([[0, 0, 1, 1, 1]] * 3, np.int32))
  assert packed.lengths_B is None
  np.testing.assert_array_equal(packed.segments_BT[0], [0, 0, 1, -1, -1])


@pytest.mark.parametrize("mode,packed", [("parallel", False), ("parallel", True),
                                         ("jacobi", False)])
def test_cudnn_forms_equal_xla_in_values_and_gradients(cudnn_on_cpu, mode, packed):
  """Right padding without segment ids: causal with lengths (no mask); packed documents:
  the dense mask with is_causal. Both equal xla at every real token, and in gradients."""
  base = dict(vocab_size=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=64,
              max_seq_len=T, recurrence=T2MLRConfig(l_start=1, l_end=1),
              schedule_options=dict(d_forward=2, d_backward=1))
  xla, cudnn = ModelConfig(**base), ModelConfig(**base, attention="cudnn")
  params = init_params(xla, jax.random.PRNGKey(0))
  tokens, cf, seg, targets = _batch()
  side = dict(control_flow=cf, segment_ids=seg if packed else None)
  a = forward(params, xla, tokens, mode=mode, **side)
  b = forward(params, cudnn, tokens, mode=mode, **side)
  assert set(cudnn_on_cpu) == ({"mask"} if packed else {("lengths", True, None)})
  valid = cf > 0
  np.testing.assert_allclose(np.asarray(b)[valid], np.asarray(a)[valid], atol=2e-5)
  grad = lambda cfg: jax.grad(lambda p: loss(p, cfg, tokens, mode=mode, targets=targets,
                                             **side))(params)
  for x, y in zip(jax.tree.leaves(grad(cudnn)), jax.tree.leaves(grad(xla))):
    np.testing.assert_allclose(x, y, atol=2e-5)


def test_cudnn_local_windows_switch_between_one_call_per_window(cudnn_on_cpu):
  """nanochat's windowed layers in a layer scan: cuDNN's sliding window, one call per
  window chosen by lax.switch; equal to xla in values and gradients."""
  base = dict(vocab_size=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=64,
              max_seq_len=T, window_pattern="SL", window_short=32)
  xla, cudnn = ModelConfig(**base), ModelConfig(**base, attention="cudnn")
  params = init_params(xla, jax.random.PRNGKey(0))
  tokens, cf, _, targets = _batch()
  a = forward(params, xla, tokens, mode="parallel", control_flow=cf)
  b = forward(params, cudnn, tokens, mode="parallel", control_flow=cf)
  assert set(cudnn_on_cpu) == {("lengths", True, (32, 0)), ("lengths", True, None)}
  valid = cf > 0
  np.testing.assert_allclose(np.asarray(b)[valid], np.asarray(a)[valid], atol=2e-5)
  text = jax.jit(lambda p: forward(p, cudnn, tokens, mode="parallel", control_flow=cf)
                 ).lower(params).as_text()
  assert "case" in text or "conditional" in text      # the per-window switch
  grad = lambda cfg: jax.grad(lambda p: loss(p, cfg, tokens, mode="parallel",
                                             targets=targets, control_flow=cf))(params)
  for x, y in zip(jax.tree.leaves(grad(cudnn)), jax.tree.leaves(grad(xla))):
    np.testing.assert_allclose(x, y, atol=2e-5)


def test_left_padded_prompts_take_the_mask_form(cudnn_on_cpu):
  """generate's prefill pads on the left: its padding is a segment of its own, so cuDNN
  takes the mask there, and the tokens equal xla's."""
  from t2mlr_jax.model.decode import generate
  base = dict(vocab_size=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=64,
              max_seq_len=64, recurrence=T2MLRConfig(l_start=1, l_end=1),
              schedule_options=dict(d_forward=2, d_backward=1))
  xla, cudnn = ModelConfig(**base), ModelConfig(**base, attention="cudnn")
  params = init_params(xla, jax.random.PRNGKey(0))
  prompt = np.array([[0, 0, 0, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8]], np.int32)
  run = lambda cfg: generate(params, cfg, prompt, max_new_tokens=4,
                             prompt_lengths=np.array([5, 8]), return_logits=True)
  (ta, la), (tb, lb) = run(xla), run(cudnn)
  assert set(cudnn_on_cpu) == {"mask"}
  np.testing.assert_array_equal(ta, tb)
  np.testing.assert_allclose(lb, la, atol=2e-5)


def test_cudnn_is_chosen_for_the_card():
  """auto: cuDNN on sm80+ in bf16/fp16 with head sizes it takes; xla on the T4 (sm75),
  for fp32 models and other head sizes. Forced where it cannot run: one line naming
  model.attention and what is allowed."""
  resolve, Target = kernels.resolve, kernels.Target
  a100 = Target("gpu", "NVIDIA A100-SXM4-80GB", (8, 0))
  t4 = Target("gpu", "Tesla T4", (7, 5))
  assert resolve("auto", "bfloat16", H100, head_dim=128) == "cudnn"
  assert resolve("auto", "float16", a100, head_dim=64) == "cudnn"
  assert resolve("auto", "bfloat16", H100, head_dim=256) == "cudnn"   # Hopper: up to 256
  assert resolve("auto", "bfloat16", a100, head_dim=256) == "xla"     # before: up to 128
  assert resolve("auto", "bfloat16", a100, head_dim=36) == "xla"      # multiples of 8
  assert resolve("auto", "bfloat16", t4, head_dim=64) == "xla"
  assert resolve("auto", "float32", H100, head_dim=64) == "xla"
  with pytest.raises(ValueError, match=r"^model\.attention='cudnn' is invalid: allowed "
                     r"'xla' or 'auto' on Tesla T4: cudnn needs a GPU of compute "
                     r"capability 8\.0 or later \(Tesla T4 is 7\.5\)$"):
    resolve("cudnn", "bfloat16", t4, head_dim=64)
  with pytest.raises(ValueError, match=r"'xla' or 'auto' on NVIDIA A100-SXM4-80GB: cudnn "
                     r"needs a head size that is a multiple of 8 and at most 128 .*"
                     r"\(model\.head_dim 192\)"):
    resolve("cudnn", "bfloat16", a100, head_dim=192)
  # the capability of a listed card's kind under an abstract mesh (it carries only the kind)
  assert kernels._capability("Tesla T4") == (7, 5)
  assert kernels._capability("NVIDIA H200") == (9, 0)
