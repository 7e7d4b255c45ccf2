"""Language-model data: text sources, packing, prepared datasets, the Grain stream and
its resume state, and the recurrent memory / attention at document boundaries."""

import json

import numpy as np
import pytest
from model.test_recurrence_lrt import active as lrt_active, lrt_cfg

from t2mlr_jax import forward
from t2mlr_jax.data import lm, pipeline, prepare, text
from t2mlr_jax.losses import IGNORE

from _util import active_params, max_abs, tiny_cfg

DOCS = ["Shall I compare thee to a summer’s day?", "Thou art more lovely and more temperate.",
        "Rough winds do shake the darling buds of May, and summer’s lease hath all too short "
        "a date.", "x", "日本語のテキスト"]


def _packed(docs, T, bos=1, eos=2):
  tok = lm.byte_tokenizer()
  wrapped = [lm.document_tokens(ids, bos, eos) for ids in tok.encode_batch(docs)]
  return wrapped, list(lm.pack_documents(wrapped, T))


@pytest.mark.parametrize("T", [4, 7, 16, 64])
@pytest.mark.parametrize("bos", [1, None])
def test_packing_loses_and_duplicates_nothing(T, bos):
  wrapped, blocks = _packed(DOCS, T, bos=bos)
  stream = np.concatenate(wrapped)
  assert all(b.shape == (2, T + 1) for b in blocks)
  inputs = np.concatenate([b[0, :-1] for b in blocks])
  targets = np.concatenate([b[0, 1:] for b in blocks])
  n = len(stream)
  # every token but the last is an input once, every token but the first a target once
  # (the last may sit as an input with nothing to predict, before the padding)
  assert np.array_equal(inputs[:n - 1], stream[:-1])
  assert (inputs[n:] == -1).all() and set(inputs[n - 1:n].tolist()) <= {int(stream[-1]), -1}
  assert np.array_equal(targets[:n - 1], stream[1:]) and (targets[n - 1:] == -1).all()
  flags = np.concatenate([b[1, :-1] for b in blocks])[:n]
  starts = np.cumsum([0] + [len(w) for w in wrapped[:-1]])
  assert np.flatnonzero(flags).tolist() == starts.tolist()


def test_decoded_blocks_reset_positions_and_segments_at_document_starts():
  T = 24
  wrapped, blocks = _packed(DOCS[:2] + ["ab"], T)
  ex = lm.decode_block(blocks[1], pad_id=0)
  flags = blocks[1][1, :-1].astype(bool)
  flags[0] = True
  for t in range(T):
    if flags[t]:
      assert ex["positions"][t] == 0
    else:
      assert ex["positions"][t] == ex["positions"][t - 1] + 1
  assert np.array_equal(ex["segment_ids"], np.cumsum(flags) - 1)
  # a target that opens a document (the next BOS) is not predicted
  opens_next = blocks[1][1, 1:] == 1
  assert (ex["target_ids"][opens_next] == IGNORE).all()
  assert (ex["target_ids"][~opens_next] == blocks[1][0, 1:][~opens_next]).all()
  last = lm.decode_block(blocks[-1], pad_id=0)
  pad = blocks[-1][0, :-1] < 0
  assert pad.any() and (last["control_flow"][pad] == 0).all()
  assert (last["target_ids"][pad] == IGNORE).all() and (last["segment_ids"][pad] == -1).all()
  assert "segment_ids" not in lm.decode_block(blocks[1], mask_documents=False)


def test_a_stream_block_is_read_as_the_lrt_release_reads_it():
  """documents="stream": positions 0..T-1 from the block start (so the memory resets at
  t = 0 only), every target predicted (the next document's BOS too), no segment ids."""
  T = 24
  _, blocks = _packed(DOCS[:2] + ["ab"], T)
  ex = lm.decode_block(blocks[1], mask_documents=False, documents="stream")
  assert ex["positions"].tolist() == list(range(T)) and "segment_ids" not in ex
  assert (ex["target_ids"] == blocks[1][0, 1:]).all()
  assert (blocks[1][1, 1:] == 1).any()        # the block does hold a document start
  last = lm.decode_block(blocks[-1], mask_documents=False, documents="stream")
  pad = blocks[-1][0, :-1] < 0
  assert (last["target_ids"][pad] == IGNORE).all() and (last["positions"][pad] == 0).all()
  with pytest.raises(ValueError, match="allowed only with data.mask_documents=False"):
    lm.decode_block(blocks[1], documents="stream")
  with pytest.raises(ValueError, match=r"documents='all' is invalid: allowed one of"):
    lm.decode_block(blocks[1], documents="all")


def _two_documents(T=16):
  """A block that holds the end of one document and a whole second one, and the second
  document alone (positions from 0): the model must treat both the same."""
  doc_a = np.array([5, 9, 3, 17, 4, 30])
  doc_b = np.array([8, 21, 6, 11, 3])
  wrapped = [lm.document_tokens(doc_a, 1, 2), lm.document_tokens(doc_b, 1, 2)]
  block = next(lm.pack_documents(wrapped, T))
  start = len(wrapped[0])
  return block, start, len(wrapped[1])


@pytest.mark.parametrize("kind", ["t2mlr", pytest.param("lrt", marks=pytest.mark.slow)])
def test_memory_and_attention_restart_at_a_document_start_in_every_mode(kind):
  """Packed with segment ids, the second document's logits equal the document run alone,
  in every mode: neither attention nor the recurrent memory crosses the boundary."""
  if kind == "t2mlr":
    cfg = tiny_cfg(vocab_size=40)
    params, modes_ = active_params(cfg), ("parallel", "exact", "jacobi")
  else:
    cfg = lrt_cfg()
    params, modes_ = lrt_active(cfg), ("parallel", "exact", "interleaved", "chunked",
                                       "multi_refine")
  block, s, n = _two_documents()
  ex = lm.decode_block(block)
  alone = np.zeros(len(ex["input_ids"]), np.int32)
  alone[:n] = ex["input_ids"][s:s + n]
  for mode in modes_:
    packed = forward(params, cfg, ex["input_ids"][None], mode=mode,
                     positions=ex["positions"][None], segment_ids=ex["segment_ids"][None])
    single = forward(params, cfg, alone[None], mode=mode)
    assert max_abs(packed[0, s:s + n], single[0, :n]) < 2e-5, mode
  # without masking, attention crosses documents: the second document sees the first
  crossing = forward(params, cfg, ex["input_ids"][None], mode="exact",
                     positions=ex["positions"][None])
  single = forward(params, cfg, alone[None], mode="exact")
  assert max_abs(crossing[0, s:s + n], single[0, :n]) > 1e-4


def test_bpe_training_is_deterministic_and_round_trips(tmp_path):
  docs = DOCS * 10
  a = lm.train_bpe(iter(docs), 300, str(tmp_path / "a"))
  b = lm.train_bpe(iter(docs), 300, str(tmp_path / "b"))
  assert a.sha256 == b.sha256
  assert (a.bos_id, a.eos_id, a.pad_id) == (1, 2, 0)
  from t2mlr_jax.data.tokenizer import load_tokenizer
  tok = load_tokenizer(str(tmp_path / "a"))
  for doc, ids in zip(DOCS, a.encode_batch(DOCS)):
    assert tok.decode(ids) == doc
    assert int(a.token_bytes[ids].sum()) == len(doc.encode("utf-8"))
  with pytest.raises(ValueError, match="vocab_size=100 is too small"):
    lm.train_bpe(iter(docs), 100, str(tmp_path / "c"))


def test_byte_tokenizer_round_trip():
  from t2mlr_jax.data.byte_tokenizer import TOKENIZER
  tok = lm.byte_tokenizer()
  for doc in DOCS:
    ids = tok.encode_batch([doc])[0]
    assert TOKENIZER.decode(ids) == doc
    assert int(tok.token_bytes[ids].sum()) == len(doc.encode("utf-8"))


def _corpus(tmp_path):
  train = tmp_path / "train.jsonl"
  train.write_text("".join(json.dumps({"text": d, "n": i}) + "\n" for i, d in enumerate(DOCS)))
  valid = tmp_path / "valid.txt"
  valid.write_text("A held-out line of verse, unseen in training.\n")
  return str(train), str(valid)


def test_prepare_writes_shards_and_a_manifest(tmp_path):
  train, valid = _corpus(tmp_path)
  out = str(tmp_path / "prepared")
  manifest = prepare.prepare(train, out, validation=valid, block_size=8, blocks_per_shard=5,
                             progress=False)
  info = manifest["splits"]["train"]
  assert info["documents"] == len(DOCS)
  assert info["bytes"] == sum(len(d.encode()) for d in DOCS)
  assert info["tokens"] == info["bytes"] + 2 * len(DOCS)        # + BOS/EOS each
  assert len(info["shards"]) == -(-info["blocks"] // 5)
  src = lm.BlockSource(out, "train")
  assert len(src) == info["blocks"] == -(-(info["tokens"] - 1) // 8)
  ids = np.concatenate([src[i]["input_ids"][src[i]["control_flow"] > 0]
                        for i in range(len(src))])
  assert len(ids) in (info["tokens"] - 1, info["tokens"])   # the last token: a target only
  assert not (tmp_path / "prepared" / lm.TOKENIZER_DIR).exists()    # byte-level: no file
  assert len(lm.BlockSource(out, "validation")) == manifest["splits"]["validation"]["blocks"]
  with pytest.raises(ValueError, match="exists: pass --overwrite"):
    prepare.prepare(train, out, block_size=8, progress=False)
  assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]   # nothing half-written


def test_parquet_source_and_bad_inputs(tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq
  pq.write_table(pa.table({"content": DOCS}), str(tmp_path / "docs.parquet"))
  assert list(text.iter_documents(str(tmp_path / "*.parquet"), text_field="content")) == DOCS
  with pytest.raises(ValueError, match="no text column 'text'.*content"):
    list(text.iter_documents(str(tmp_path / "docs.parquet")))
  with pytest.raises(ValueError, match="matches no file.*looked for"):
    list(text.iter_documents(str(tmp_path / "missing/*.jsonl")))
  (tmp_path / "empty.txt").write_text("  \n")
  with pytest.raises(ValueError, match="empty.txt' holds no document"):
    list(text.iter_documents(str(tmp_path / "empty.txt")))
  (tmp_path / "r.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
  with pytest.raises(ValueError, match=r"r.jsonl:1: no text field 'text'.*\['body'\]"):
    list(text.iter_documents(str(tmp_path / "r.jsonl")))
  with pytest.raises(ValueError, match="no manifest.json"):
    lm.BlockSource(str(tmp_path), "train")


def test_stream_epochs_and_resume_mid_epoch(tmp_path):
  """Each epoch reads every block once (in a new order); an iterator restored from its
  saved state continues with the next unseen block."""
  train, _ = _corpus(tmp_path)
  out = str(tmp_path / "p")
  prepare.prepare(train, out, block_size=4, progress=False)
  src = lm.BlockSource(out, "train")
  n = len(src)
  kw = dict(global_batch=1, seq_len=4, shuffle=True, seed=3, num_examples=2 * n)
  order = [b["input_ids"][0].tolist() for b in pipeline.make_iterator(src, **kw)]
  everything = sorted(src[i]["input_ids"].tolist() for i in range(n))
  assert sorted(order[:n]) == everything and sorted(order[n:]) == everything
  assert order[:n] != order[n:]
  it = pipeline.make_iterator(src, **kw)
  for _ in range(n - 2):
    next(it)
  state = it.get_state()
  resumed = pipeline.make_iterator(src, **kw)
  resumed.set_state(state)
  assert [b["input_ids"][0].tolist() for b in resumed] == order[n - 2:]
