"""The control-flow code every token carries (docs/models.md#control-flow), shared by every
recurrence type and every mode: 0 padding (writes a zero state, reads none), 1
non-recurrent (reads no memory, runs as the base model, writes its state for the next
token), 2 recurrent (reads and writes)."""

CF_PAD, CF_PLAIN, CF_RECURRENT = 0, 1, 2
