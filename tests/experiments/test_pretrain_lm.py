"""experiments/pretrain_lm.py: every arm is a valid config of its variant, results
accumulate one file per seed, and the table reports mean and range over the seeds."""

import json
import math

import pytest

from _util import REPO_ROOT, load_file

ROOT = REPO_ROOT


def _module():
  return load_file("experiments", "pretrain_lm.py")


def test_every_arm_validates_and_the_lrt_arms_are_the_papers():
  from t2mlr_jax.train.config import train_mode, validate
  pl = _module()
  base = validate(pl.arm_config("transformer", 600, 4, 0, "d")).num_params()
  for name in pl.ARMS:
    config = pl.arm_config(name, 600, 4, 0, "d")
    cfg = validate(config)
    if name in ("lrt", "lrt_shared", "lrt_lr0.02", "lrt_lr0.04", "lrt_final"):
      assert abs(cfg.num_params() / base - 1) < 0.005, name      # matched within 0.5%
      r = cfg.recurrence
      assert r.projection == "shared" and r.residual and r.key and r.value
      assert not r.value_embeds
      assert r.source_layer == (-1 if name == "lrt_final" else 2)
      assert config.optimizer.name == ("adamw" if name == "lrt_shared" else "muon")
    if name.startswith("t2mlr_") and name != "t2mlr_all":
      assert train_mode(config, cfg) == "jacobi"
  jacobi = lambda name: (lambda r: (r.d_forward, r.d_backward, r.jacobi_tol))(
      pl.arm_config(name, 600, 4, 0, "d").model.schedule_options)
  assert jacobi("t2mlr") == (4, 1, None)               # the variant's default since 4/1
  assert jacobi("t2mlr_16_4") == (16, 4, None)         # the paper's, pinned
  assert jacobi("t2mlr_tol") == (16, 4, 1e-2)
  assert not pl.arm_config("lrt_residual", 600, 4, 0, "d").model.recurrence.key
  muon = pl.arm_config("lrt", 600, 4, 0, "d")
  assert muon.optimizer.matrix_lr == 0.01                       # the sweep's winner
  same = pl.arm_config("transformer_muon_lr0.01", 600, 4, 0, "d").optimizer
  assert same.to_dict() == muon.optimizer.to_dict()             # LRT's recipe, exactly
  assert pl.arm_config("lrt_lr0.02", 600, 4, 0, "d").optimizer.matrix_lr == 0.02
  assert muon.optimizer.name == "muon" and muon.model.tie_embeddings
  assert muon.optimizer.embedding_lr == muon.optimizer.unembedding_lr   # the tied head's
  with pytest.raises(SystemExit, match="unknown arm"):
    pl.arm_config("lrt_wide", 600, 4, 0, "d")


def _arm(params, flops, bpb, steps=600, curve=None):
  return {"params": params, "steps": steps, "tokens": steps * 16 * 256,
          "step_flops": flops / steps, "flops": flops,
          "flops_spent": flops, "final": {"exact": bpb}, "variant": "v",
          "curve": curve or [{"flops": flops, "exact": bpb}]}


def test_results_accumulate_per_seed_and_the_table_gives_mean_and_range(tmp_path):
  pl = _module()
  assert pl.results_path(0, str(tmp_path)).endswith("/pretrain_lm.json")
  assert pl.results_path(2, str(tmp_path)).endswith("/pretrain_lm_seed2.json")
  curve = [{"flops": 1e13, "exact": 2.4}, {"flops": 1e14, "exact": 2.0}]
  for seed, (tf, t2) in enumerate([(2.25, 2.27), (2.27, 2.26), (2.26, 2.30)]):
    path = pl.results_path(seed, str(tmp_path))
    for name, arm in (("transformer", _arm(1000, 2e13, tf)), ("t2mlr", _arm(990, 8e13, t2)),
                      ("transformer_flops", _arm(1000, 1e14, 2.0, 3000, curve))):
      result = pl.read_json(path, default=pl.EMPTY)                # each arm added to what is there
      result["seed"] = seed
      result["arms"][name] = arm
      pl.write_json(path, result, indent=2, stamp=False)
  assert sorted(json.load(open(pl.results_path(1, str(tmp_path))))["arms"]) == \
      ["t2mlr", "transformer", "transformer_flops"]
  rows = {line.split(" | ")[0][2:]: line.split(" | ")
          for line in pl.table(str(tmp_path)).splitlines()[2:]}
  assert rows["transformer"][2:7] == ["0,1,2", "2.46", "20.0", "1.00×",
                                      "2.2600 (2.2500–2.2700)"]
  assert rows["t2mlr"][2:7] == ["0,1,2", "2.46", "80.0", "4.00×", "2.2767 (2.2600–2.3000)"]
  # the transformer's BPB at 8e13 FLOPs, linear in log FLOPs between 1e13 and 1e14
  expected = 2.4 - 0.4 * math.log10(8)
  assert float(rows["t2mlr"][7].rstrip(" |")) == pytest.approx(expected, abs=1e-4)
  # t2mlr − transformer: +0.0167 in the means, but 2.26–2.30 overlaps 2.25–2.27
  c = pl.compare(pl.seeds_recorded(str(tmp_path)), "t2mlr", "transformer")
  assert c["gap"] == pytest.approx(2.2767 - 2.26, abs=1e-4) and c["seeds"] == (3, 3)
  assert c["beyond_range"] is False
  assert "| t2mlr − transformer | 3 / 3 | +0.0167 | no (ranges overlap) |" in \
      pl.comparisons(str(tmp_path))


def test_a_gap_beyond_the_seed_ranges_and_a_single_seed_are_said_so():
  pl = _module()
  seeds = {s: {"arms": {"a": _arm(1, 1, 2.30 + 0.01 * s), "b": _arm(1, 1, 2.20 + 0.01 * s),
                        "c": _arm(1, 1, 2.5)}} for s in range(2)}
  assert pl.compare(seeds, "a", "b")["beyond_range"] is True       # 2.30–2.31 vs 2.20–2.21
  tie = {s: {"arms": {"a": _arm(1, 1, 2.30 + 0.01 * s), "t": _arm(1, 1, 2.3000000 - 1e-7)}}
         for s in range(2)}
  del tie[1]["arms"]["t"]
  assert pl.compare(tie, "t", "a")["beyond_range"] is False    # 2.3000 at the shown precision
  seeds = {0: seeds[0]}
  assert pl.compare(seeds, "a", "c") == {"gap": pytest.approx(-0.2), "seeds": (1, 1),
                                         "beyond_range": None}


def test_the_equal_flops_column_reads_the_transformer_of_the_same_optimizer(tmp_path):
  """transformer_flops is trained with AdamW: a Muon arm gets no reading from its curve."""
  pl = _module()
  curve = [{"flops": 1e13, "exact": 2.4}, {"flops": 1e14, "exact": 2.0}]
  path = pl.results_path(0, str(tmp_path))
  result = {"seed": 0, "arms": {"transformer": _arm(1000, 2e13, 2.25),
                                "transformer_flops": _arm(1000, 1e14, 2.0, 3000, curve),
                                "t2mlr": _arm(990, 4e13, 2.2),
                                "lrt": {**_arm(990, 4e13, 2.1), "optimizer": "muon"}}}
  pl.write_json(path, result, indent=2, stamp=False)
  rows = {line.split(" | ")[0][2:]: line.split(" | ")
          for line in pl.table(str(tmp_path)).splitlines()[2:]}
  assert rows["t2mlr"][7] != "— |" and rows["lrt"][7] == "— |"


def test_the_jacobi_table_gives_each_t2mlr_setting_its_sweeps_and_cost(tmp_path):
  pl = _module()
  rec = lambda d_f, d_b, tol=None: {"d_forward": d_f, "d_backward": d_b, "jacobi_tol": tol}
  arm = lambda d_f, d_b, flops, bpb, sweeps, tol=None: {
      **_arm(990, flops, bpb), "variant": "t2mlr", "recurrence": rec(d_f, d_b, tol),
      "jacobi_sweeps_mean": sweeps, "final": {"exact": bpb, "parallel": 2.4, "jacobi": bpb}}
  for seed, bpb in enumerate((2.27, 2.29)):
    pl.write_json(pl.results_path(seed, str(tmp_path)), {"seed": seed, "arms": {
        "transformer": _arm(1000, 2e13, 2.26), "t2mlr": arm(4, 1, 4e13, bpb, 4.0),
        "t2mlr_tol": arm(16, 4, 7e13, 2.28, 9.5, 1e-2)}}, stamp=False)
  rows = {line.split(" | ")[0][2:]: line.split(" | ")
          for line in pl.jacobi_table(str(tmp_path)).splitlines()[2:]}
  assert rows["t2mlr"][1:9] == ["adamw", "4 / 1", "—", "4.00", "40.0", "2.00×", "2",
                                    "2.2800 (2.2700–2.2900)"]
  assert rows["t2mlr_tol"][3:6] == ["0.01", "9.50", "70.0"]
  assert "transformer" not in rows
