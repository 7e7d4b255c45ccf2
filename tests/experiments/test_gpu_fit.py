"""experiments/gpu_fit.py's search and resume, with a fake compile (no CUDA plugin): a cell
that fits is compiled once; one that does not gets the smallest fitting
`grad_accum_steps` (2, 4, 8, ... while the microbatch splits over the mesh), then the
stronger remat policies; results are written after every compile, and a rerun skips the
finished cells and resumes an unfinished one from the compiles it recorded."""

import pytest

from _util import load_file

GiB = 2 ** 30


def _fit():
  return load_file("experiments", "gpu_fit.py")


def _fake_compile(needs_gib, batch=256, devices=8, budget_gib=58.74, calls=None,
                  own_remat="none"):
  """A compile whose train step needs needs_gib(k, remat) GiB a device (k microbatches)."""
  def compile_fn(config, topology, overrides, accum=None, remat=None):
    remat_ = remat or own_remat
    k = accum or 1
    if calls is not None:
      calls.append((config, k, remat_))
    total = int(needs_gib(k, remat_) * GiB)
    budget = int(budget_gib * GiB)
    flags = (f" --config.train.grad_accum_steps={k}" if accum else "") + (
        f" --config.model.remat={remat}" if remat else "")
    return {
        "fits": total <= budget, "grad_accum_steps": k, "remat": remat_,
        "state_bytes_per_device": GiB // 4, "state_sharded_bytes_per_device": GiB // 4,
        "state_replicated_bytes": 0, "hbm_bytes_per_device": budget, "attention": "cudnn",
        "mesh": {"data": 1, "fsdp": devices, "tensor": 1}, "devices": devices,
        "num_params": 135_000_000, "mode": "jacobi", "batch_size": batch, "seq_len": 2048,
        "command": f"python -m t2mlr_jax.compile --config={config}{flags}",
        "wall_seconds": 30.0,
        "steps": [{"step": "train", "fits": total <= budget, "temp_bytes": total - GiB // 4,
                   "total_bytes": total, "kernels": {"fused_attention": 40, "gemm": 90},
                   "collectives": {"all-reduce": 2}, "compile_seconds": 25.0,
                   "model_flops_per_device": 1e14, "step_seconds_floor": 0.1}]}
  return compile_fn


@pytest.fixture
def fit(monkeypatch):
  module = _fit()
  monkeypatch.setattr(module, "CELLS", {
      "a": ("configs/a.py", "h100-8", (), "fits"),
      "b": ("configs/b.py", "h100-8", (), "needs 4 microbatches"),
      "c": ("configs/c.py", "h100-8", (), "needs remat"),
  })
  return module


def test_the_smallest_fitting_accumulation_is_found_and_every_compile_is_written(fit):
  calls, written = [], []
  fake = _fake_compile(lambda k, r: 200 / k, calls=calls)
  entry = fit.run_cell("b", fake, save=lambda e: written.append(len(e.get("tries", ()))))
  assert [k for _, k, _ in calls] == [1, 2, 4]                # 200, 100, 50 GiB of 58.74
  assert written == [0, 1, 2]                                 # after each compile
  assert entry["complete"] and not entry["default"]["fits"]
  assert entry["smallest_fitting_grad_accum_steps"] == 4 and entry["fitting_remat"] == "none"
  assert entry["fitting_command"].endswith("--config.train.grad_accum_steps=4")
  assert entry["tries"][-1]["total_gib"] == pytest.approx(50.0, abs=1e-3)


def test_a_fitting_config_is_compiled_once(fit):
  calls = []
  entry = fit.run_cell("a", _fake_compile(lambda k, r: 10, calls=calls))
  assert len(calls) == 1 and entry["complete"] and entry["default"]["fits"]
  assert "tries" not in entry


def test_accumulation_stops_where_the_mesh_no_longer_divides_then_remat_is_tried(fit):
  """Batch 64 on 8 devices: 2, 4, 8 microbatches (8 rows, one a device), not 16; then
  remat dots and full, each from 1 microbatch, until one fits; where none does, said so."""
  calls = []
  needs = lambda k, r: {"none": 800, "dots": 600, "full": 200}[r] / k
  entry = fit.run_cell("c", _fake_compile(needs, batch=64, calls=calls))
  assert [(k, r) for _, k, r in calls] == [
      (1, "none"), (2, "none"), (4, "none"), (8, "none"),
      (1, "dots"), (2, "dots"), (4, "dots"), (8, "dots"),
      (1, "full"), (2, "full"), (4, "full")]                  # 200 / 4 = 50 fits
  assert entry["smallest_fitting_grad_accum_steps"] == 4
  assert entry["fitting_remat"] == "full"
  assert "--config.model.remat=full" in entry["fitting_command"]
  never = fit.run_cell("c", _fake_compile(lambda k, r: 1000, batch=64))
  assert never["complete"] and never["smallest_fitting_grad_accum_steps"] is None
  assert "none tried fits" in fit.table({"cells": {"c": never}})


def test_a_config_already_at_full_remat_tries_no_other(fit):
  calls = []
  entry = fit.run_cell("c", _fake_compile(lambda k, r: 1000, batch=16, own_remat="full",
                                          calls=calls))
  assert [(k, r) for _, k, r in calls] == [(1, "full"), (2, "full")]
  assert entry["smallest_fitting_grad_accum_steps"] is None


def test_a_killed_run_resumes_from_its_last_compile_and_skips_finished_cells(fit):
  needs = {"configs/a.py": lambda k, r: 10, "configs/b.py": lambda k, r: 200 / k}
  stored = {}

  def write(results):                     # what is on disk: a copy after every compile
    import copy
    stored["file"] = copy.deepcopy(results)

  def fake(calls):
    fakes = {c: _fake_compile(f, calls=calls) for c, f in needs.items()}
    return lambda config, *a, **kw: fakes[config](config, *a, **kw)

  with pytest.raises(KeyboardInterrupt):   # killed at the fourth compile, b's k = 4
    fit.run(["a", "b"], {"cells": {}}, write, _killed_at(3, fake([])))
  on_disk = stored["file"]["cells"]
  assert on_disk["a"]["complete"] and not on_disk["b"]["complete"]
  assert [t["grad_accum_steps"] for t in on_disk["b"]["tries"]] == [2]
  second = []
  results = fit.run(["a", "b"], stored["file"], write, fake(second))
  assert [(c, k) for c, k, _ in second] == [("configs/b.py", 4)]   # only the missing one
  b = results["cells"]["b"]
  assert b["complete"] and b["smallest_fitting_grad_accum_steps"] == 4
  assert [t["grad_accum_steps"] for t in b["tries"]] == [2, 4]
  third = []
  fit.run(["a", "b"], results, write, fake(third))
  assert third == []                                       # everything recorded: skipped
  fit.run(["a"], results, write, fake(third), redo=True)
  assert len(third) == 1
  table = fit.table(results)
  assert "| `a.py` | h100-8 (8) | jacobi, 256 × 2048 |" in table
  assert "| no | 4 (50.00) | 25 / 25 | 40 | 100 ms |" in table


def _killed_at(n, compile_fn):
  """compile_fn, killed (KeyboardInterrupt) at its n-th call, 0-based."""
  calls = []

  def fn(*a, **kw):
    if len(calls) == n:
      raise KeyboardInterrupt
    calls.append(a)
    return compile_fn(*a, **kw)
  return fn
