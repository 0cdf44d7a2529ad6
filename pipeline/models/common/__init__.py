"""Family-neutral helpers of the random test checkpoints every family writes: the BPE tokenizer trained offline on an
embedded corpus, the random-weights marker file, and building modules straight on a device in a dtype. Nothing here
knows a family's layout or special tokens."""
