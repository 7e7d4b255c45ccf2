"""Convert between Hugging Face directories and t2mlr_jax checkpoints.

    python -m t2mlr_jax.convert --from-hf HF_DIR --to OUT [--l_start=4 --l_end=-5]
        HF (Llama / SmolLM2 / Qwen2, safetensors) -> a parameter export OUT (Orbax
        params + model.json + the tokenizer files) that training starts from with
        --config.model.init_from=OUT. With --l_start/--l_end a T2MLR block is added
        (γ = 0: the model still computes the pretrained function).
    python -m t2mlr_jax.convert --from-gguf MODEL.gguf --to OUT [--l_start=.. --l_end=..]
        a Llama-architecture GGUF file (any quantisation the gguf package reads,
        dequantized) -> a parameter export OUT with tokenizer.json and
        tokenizer_config.json rebuilt from the file's metadata (chat template included).
    python -m t2mlr_jax.convert --from RUN_OR_EXPORT --to-hf HF_DIR [--dtype=bfloat16]
        a training workdir (latest or --step checkpoint) or an export -> HF directory
        (base weights loadable by transformers; recurrence in t2mlr_recurrence.safetensors).
"""

from __future__ import annotations

import argparse
import os
import shutil

from t2mlr_jax import cli

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "generation_config.json")


def copy_tokenizer(src: str, dst: str, overwrite: bool = True) -> list[str]:
  """Copy the tokenizer files (TOKENIZER_FILES) src has into dst; with overwrite=False,
  those dst already has are kept."""
  copied = []
  for name in TOKENIZER_FILES:
    if not overwrite and os.path.isfile(os.path.join(dst, name)):
      continue
    if os.path.isfile(os.path.join(src, name)):
      shutil.copy(os.path.join(src, name), os.path.join(dst, name))
      copied.append(name)
  return copied


def main(argv=None):
  p = argparse.ArgumentParser(prog="python -m t2mlr_jax.convert", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  src = p.add_mutually_exclusive_group(required=True)
  src.add_argument("--from-hf", dest="from_hf", help="Hugging Face model directory")
  src.add_argument("--from-gguf", dest="from_gguf", help="Llama-architecture GGUF file")
  src.add_argument("--from", dest="from_ckpt", help="training workdir or parameter export")
  p.add_argument("--to", help="output parameter export (with --from-hf or --from-gguf)")
  p.add_argument("--to-hf", dest="to_hf", help="output Hugging Face directory (with --from)")
  p.add_argument("--step", type=int, default=None, help="checkpoint step (with --from)")
  p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
  p.add_argument("--l_start", type=int, default=None, help="add T2MLR from this layer")
  p.add_argument("--l_end", type=int, default=None, help="... to this layer (inclusive)")
  p.add_argument("--gate_gain", type=float, default=1e-2, help="gate init gain (retrofit)")
  p.add_argument("--verbose", action="store_true", help="show the full traceback of an error")
  args = p.parse_args(argv)
  if (args.from_hf or args.from_gguf) and not args.to:
    p.error("--from-hf / --from-gguf need --to OUT")
  if (args.l_start is None) != (args.l_end is None):
    p.error("give both --l_start and --l_end to add a T2MLR block")
  if args.from_ckpt and not args.to_hf:
    p.error("--from needs --to-hf HF_DIR")
  # the library (and JAX) load once the arguments parse: argument errors print at once
  from t2mlr_jax import checkpoint
  from t2mlr_jax.convert import gguf, hf, loading
  from t2mlr_jax.model.recurrence.t2mlr import T2MLRConfig

  if args.from_hf or args.from_gguf:
    recurrence = None
    if args.l_start is not None:
      recurrence = T2MLRConfig(l_start=args.l_start, l_end=args.l_end, gate_gain=args.gate_gain)
    checkpoint.check_export_target(args.to)       # before reading a multi-GB source
    if args.from_gguf:
      cfg, copied = gguf.export_gguf(args.from_gguf, args.to, recurrence=recurrence,
                                     dtype=args.dtype)
      print(f"wrote {args.to} ({cfg.num_params():,} parameters; tokenizer files: {copied})")
      return
    cfg, params = hf.from_hf(args.from_hf, recurrence=recurrence)
    checkpoint.export(cfg, params, args.to)
    copied = copy_tokenizer(args.from_hf, args.to)
    print(f"wrote {args.to} ({cfg.num_params():,} parameters; tokenizer files: {copied})")
  else:
    cfg, params = checkpoint.load(args.from_ckpt, args.step)
    hf.check_llama_compatible(cfg)             # refuse before any note or directory
    try:              # the tokenizer the model came with (a workdir's data or init_from)
      found = loading.find_tokenizer(args.from_ckpt, args.step)
    except ValueError as e:
      print(f"note: {e}; writing the model without one")
      found = None
    tok = None if found is None or not hasattr(found.tokenizer, "save") else found.tokenizer
    hf.to_hf(cfg, params, args.to_hf, dtype=args.dtype, tokenizer=tok)
    copied = (["tokenizer.json", "tokenizer_config.json"] if tok is not None else [])
    copied += [c for c in copy_tokenizer(args.from_ckpt, args.to_hf, overwrite=tok is None)
               if c not in copied]
    print(f"wrote {args.to_hf} (tokenizer files: {copied})")


if __name__ == "__main__":
  cli.guard(main)
