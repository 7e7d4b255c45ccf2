"""experiments/bench_rl.py: the batched sampler and one-at-a-time generate timed side by side
on the same samples, written as JSON."""

import json

import pytest

from _util import load_file


@pytest.mark.slow       # compiles both samplers (about 15 s)
def test_bench_rl_times_both_samplers_and_writes_json(tmp_path):
  bench = load_file("experiments", "bench_rl.py")
  out = tmp_path / "rl.json"
  bench.main(["--shape", "tiny", "--prompts", "2", "--group", "3", "--prompt", "8", "--new", "4",
              "--repeats", "1", "--out", str(out)])
  result = json.loads(out.read_text())
  assert result["samples"] == 6
  assert result["batched_samples_per_s"] > 0 and result["one_at_a_time_samples_per_s"] > 0
  assert result["speedup"] == pytest.approx(
      result["raw_seconds"]["one_at_a_time"][0] / result["raw_seconds"]["batched"][0], rel=1e-2)
