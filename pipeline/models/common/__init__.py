"""Pieces several model families share: Qwen's ChatML prompt layout and function-calling format, the Hugging Face
checkpoint layout and its loading, where a thinker's sub-modules live, log-mel features and the batched audio block
encoder, TMRoPE spans, picture patches, the markers of a spoken message with video, the lifecycle of a token2wav
stream, and the helpers of the random test checkpoints every family writes (the BPE tokenizer trained offline on an
embedded corpus and its files, the random-weights marker and the other files besides the weights, building modules on
a device in a dtype, the weight tuning that makes a random model end its replies). A family imports them (never
another family's); a generic engine module never needs to."""
