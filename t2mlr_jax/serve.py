"""Serve a model over HTTP with OpenAI's API: `python -m t2mlr_jax.serve --model=PATH`.

Every source `loading` opens (GGUF, Hugging Face directory, export, training workdir),
with its tokenizer; `--max_batch` decode slots, each request with its own recurrent state;
`--host` is loopback unless given (with `--api_key` to require a bearer token). Ready when
`GET /health` says so; SIGTERM or Ctrl-C stops taking requests and finishes those in
flight. The server itself: `t2mlr_jax/serving/server.py`; docs/serving.md.
"""

from absl import flags

from t2mlr_jax import cli


def main(argv=None):
  """`python -m t2mlr_jax.serve --model=PATH`: serve the model until SIGTERM or Ctrl-C."""
  # the optional extra, checked before anything loads (--help too)
  cli.require_extra(("fastapi", "uvicorn"), "python -m t2mlr_jax.serve", "FastAPI and uvicorn",
                    "serve")
  model = flags.DEFINE_string("model", None, "a GGUF file, Hugging Face directory, export or "
                              "training workdir")
  step = flags.DEFINE_integer("step", None, "a training workdir's checkpoint step")
  tokenizer = flags.DEFINE_string("tokenizer", None, "a directory with tokenizer.json")
  dtype = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "compute dtype")
  host = flags.DEFINE_string("host", "127.0.0.1", "address to bind (loopback by default)")
  port = flags.DEFINE_integer("port", 8000, "port")
  max_batch = flags.DEFINE_integer("max_batch", 8, "decode slots (requests decoded at once)")
  max_len = flags.DEFINE_integer("max_len", None, "longest prompt + answer (default: "
                                 "min(the model's context, 2048); at most the context)")
  cache_dtype = flags.DEFINE_enum("cache_dtype", None, ["float32", "bfloat16"], "the KV "
                                  "cache's dtype (default: --dtype); bfloat16 halves it")
  compile_cache = flags.DEFINE_string("compile_cache", None, "JAX's persistent compilation "
                                      "cache, so a restart loads its programs (default: "
                                      "$XDG_CACHE_HOME or ~/.cache, /t2mlr_jax/jax_compile; "
                                      "empty: off)")
  max_queue = flags.DEFINE_integer("max_queue", 1024, "requests waiting beyond the slots; more "
                                   "are answered 429")
  api_key = flags.DEFINE_string("api_key", None, "require Authorization: Bearer KEY")
  name = flags.DEFINE_string("name", None, "the model's name in the API (default: the path's "
                              "last part)")
  cf = flags.DEFINE_enum("prompt_control_flow", None, ["1", "2"], "control flow of every "
                         "prompt (default: 2 for completions, 1 for chat)")
  warmup = flags.DEFINE_list("warmup_lengths", None, "prompt lengths whose buckets compile "
                             "before the server is ready (default: every bucket up to "
                             "--max_len)")

  def run(argv):
    del argv
    if model.value is None:
      raise ValueError("--model is required: allowed a GGUF file, a Hugging Face directory, an "
                       "export or a training workdir")
    cli.check_step(model.value, step.value)
    # the library (and JAX) load once the flags parse: argument errors print at once
    from t2mlr_jax.serving.server import serve_model
    from t2mlr_jax.train import tasks
    serve_model(model.value, step=step.value, tokenizer=tokenizer.value, dtype=dtype.value,
                host=host.value, port=port.value, max_batch=max_batch.value,
                max_len=max_len.value, max_queue=max_queue.value, api_key=api_key.value,
                name=name.value,
                prompt_control_flow=None if cf.value is None else int(cf.value),
                warmup_lengths=None if warmup.value is None else tuple(
                    int(n) for n in warmup.value),
                cache_dtype=cache_dtype.value, compile_cache=compile_cache.value,
                own=tasks.own_tokenizer)

  cli.run(run, argv)


if __name__ == "__main__":
  main()
