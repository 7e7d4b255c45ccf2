"""Ahead-of-time compile reports (t2mlr_jax/accel/aot.py): a config's model shape taken
from `model.init_from`, the batch arrays of each task, the argument checks made before
anything is built, the compiler's numbers read from HLO and out-of-memory errors, the
report's text, and (marker `tpu_compile`, with libtpu) a two-slice compile."""

import pytest

from t2mlr_jax.accel import aot, topologies
from t2mlr_jax.config import PRESETS

from _util import config_file

needs_libtpu = pytest.mark.skipif(not topologies.libtpu_available(),
                                  reason="libtpu is not installed (pip install "
                                         "\"jax[tpu]==<the installed jax>\")")
_config = config_file


def test_init_from_gives_the_shape_and_nothing_is_read(tmp_path):
  """A preset name stands for its model's shape (max_seq_len stays the config's); a path
  that is no directory is refused naming what is allowed; no init_from: the same config."""
  c = _config("fineweb_135m", "tiny")
  assert aot.shape_config(c) is c
  c.model.init_from = "smollm2-360m"
  shaped = aot.shape_config(c)
  shape = PRESETS["smollm2-360m"]
  assert (shaped.model.d_model, shaped.model.n_layers, shaped.model.n_heads) == (
      shape["d_model"], shape["n_layers"], shape["n_heads"])
  assert shaped.model.max_seq_len == 64 and shaped.model.init_from is None
  assert not shaped.model.init_required
  assert c.model.init_from == "smollm2-360m"          # the caller's config is left alone
  c.model.init_from = str(tmp_path / "nowhere")
  with pytest.raises(ValueError, match=r"model.init_from=.*nowhere.* is invalid: allowed a "
                     r"Hugging Face directory or parameter export"):
    aot.shape_config(c)


def test_batch_keys_follow_the_task():
  c = _config("fineweb_135m", "tiny")           # lm with document masks
  assert aot.batch_keys(c) == ("input_ids", "target_ids", "control_flow", "positions",
                               "segment_ids")
  c.data.mask_documents = False
  assert aot.batch_keys(c) == ("input_ids", "target_ids", "control_flow", "positions")
  s5 = _config("s5_retrieval", "tiny")
  assert aot.batch_keys(s5) == ("input_ids", "target_ids", "control_flow")


def test_bad_steps_and_slices_are_refused_before_anything_is_built():
  c = _config("fineweb_135m", "tiny")
  with pytest.raises(ValueError, match=r"--steps='train,backward' is invalid: allowed a "
                     r"comma-separated subset of \('train', 'eval', 'decode'\)"):
    aot.compile_config(c, "v5e-4", steps=("train", "backward"))
  with pytest.raises(ValueError, match="--steps='' is invalid"):
    aot.compile_config(c, "v5e-4", steps=())
  for bad in (0, True, 1.5):
    with pytest.raises(ValueError, match=rf"--num_slices={bad!r} is invalid: allowed an "
                       r"integer >= 1"):
      aot.compile_config(c, "v5e-4", num_slices=bad)
  with pytest.raises(ValueError, match="--topology='v5e-12' is unknown"):
    aot.compile_config(c, "v5e-12")


def test_collectives_kernels_and_out_of_memory_are_read_from_the_compilers_text():
  text = ("%a = f32[8] all-reduce(%x)\n%b = f32[8] all-gather-start(%y)\n"
          "%c = f32[8] all-gather-done(%b)\n%d = f32[8] all-reduce(%z)\n"
          '%e = f32[8] custom-call(%x), custom_call_target="tpu_custom_call"\n')
  assert aot._hlo_counts(text, "tpu") == ({"all-reduce": 2, "all-gather": 1}, {"mosaic": 1})
  assert aot._hlo_counts(text, "cpu") == ({"all-reduce": 2, "all-gather": 1}, {})
  assert aot._oom_summary("INVALID_ARGUMENT: bad shape") is None
  assert aot._oom_summary("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of "
                          "memory in memory space hbm. Used 20.5G of 15.75G hbm.") == \
      "the compiler needs 20.5G of 15.75G hbm per device"
  assert aot._oom_summary("RESOURCE_EXHAUSTED: 3.2G required for scoped allocation (3.2G) "
                          "exceeds available VMEM (128M)") == \
      "the compiler needs 3.2G of 128M vmem per device (for scoped allocation)"


def test_the_report_reads_as_a_few_lines():
  step = {"step": "train", "mode": "jacobi", "fits": True, "total_bytes": 3 * 2 ** 30,
          "hbm_bytes": 16 * 2 ** 30, "argument_bytes": 2 ** 30, "temp_bytes": 2 ** 31,
          "output_bytes": 2 ** 20, "alias_bytes": 2 ** 20, "headroom_bytes": 13 * 2 ** 30,
          "compile_seconds": 12.3, "collectives": {"all-reduce": 4},
          "kernels": {"mosaic": 2}, "model_flops_per_device": 1e12,
          "step_seconds_floor": 1e12 / 197e12}
  report = {"config": "tiny", "topology": "v5e-4", "jax_topology": "v5e:2x2", "devices": 4,
            "device_kind": "TPU v5 lite", "memory_text": "15.75 GiB HBM each",
            "mesh": {"data": 4}, "attention": "splash", "mode": "jacobi", "batch_size": 8,
            "seq_len": 128, "grad_accum_steps": 2, "dtype": "float32", "platform": "tpu",
            "peak_text": "bf16 peak", "state_bytes_per_device": 2 ** 20,
            "state_sharded_bytes_per_device": 2 ** 19, "state_replicated_bytes": 2 ** 19,
            "state_bytes_total": 2 ** 21, "replicated_arrays": [["final_norm/scale", [32], 128]],
            "steps": [step, {"step": "eval", "fits": False, "hbm_bytes": 16 * 2 ** 30,
                             "error": "the compiler needs 20G of 15.75G hbm per device"}],
            "fits": False}
  lines = aot.format_report(report).splitlines()
  assert lines[0].startswith("tiny on v5e-4 (v5e:2x2, 4 x TPU v5 lite, 15.75 GiB HBM each)")
  assert "batch 8 x 128 in 2 microbatches, float32" in lines[0]
  assert lines[1] == ("  state per device: 1.00 MiB (512.00 KiB sharded + 512.00 KiB "
                      "replicated on every device; the whole state 2.00 MiB)")
  assert lines[2] == "  replicated parameters (largest): final_norm/scale (32,)"
  assert lines[3].startswith("  train: fits: 3.00 GiB of 16.00 GiB per device")
  assert "collectives: all-reduce 4; Mosaic kernels 2; model FLOPs 1e+12" in lines[3]
  assert lines[4] == "  eval: DOES NOT FIT: the compiler needs 20G of 15.75G hbm per device"
  assert lines[5] == "does not fit"


@pytest.mark.tpu_compile
@needs_libtpu
def test_two_slices_put_the_data_axis_over_dcn():
  c = _config("fineweb_135m", "tiny")
  r = aot.compile_config(c, "v5e-4", num_slices=2)
  assert r["fits"] and r["devices"] == 8 and r["mesh"]["data"] == 8
  c.mesh.update(data=1, fsdp=-1)
  with pytest.raises(ValueError, match=r"mesh.data=1 is invalid over 2 slices"):
    aot.compile_config(c, "v5e-4", num_slices=2)
